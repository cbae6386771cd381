#!/usr/bin/env python
"""Make the built-in demo datasets (COCO-format shapes + ADE20K-layout shapes,
and, on request, a shape-classification ImageFolder tree for pretraining and
a relation-classification one for the gate ablation).

    python tools/make_demo_data.py      # -> data/demo_coco, data/demo_ade
    python tools/make_demo_data.py --seed 1 --det-train 256 --size 160 224
    python tools/make_demo_data.py --sets cls     # -> data/demo_cls
    python tools/make_demo_data.py --sets rel     # -> data/demo_rel

A set that is already there with the same seed and parameters is kept unless
``--force``; one made with other parameters is regenerated in place.
"""
from __future__ import annotations

import argparse
import os.path as osp
import sys
import time

from posmlp_dense.data import relation_classes, shape_classes
from posmlp_dense.data import shapes as demo_data


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Write the built-in demo datasets: <out>/demo_coco '
        '(COCO detection/instance format) and <out>/demo_ade (ADE20K '
        'layout, reduce_zero_label convention).')
    parser.add_argument('--out', default='data',
                        help='parent folder of demo_coco/ and demo_ade/ '
                        '(default: data)')
    parser.add_argument('--seed', type=int, default=0)
    for task, name, splits in (('det', 'detection', demo_data.DETECTION_SPLITS),
                               ('seg', 'segmentation',
                                demo_data.SEGMENTATION_SPLITS)):
        for split, what, default in zip(('train', 'val'),
                                        ('training', 'validation'), splits):
            parser.add_argument(f'--{task}-{split}', type=int,
                                default=default,
                                help=f'{name} {what} images (default: '
                                f'{default})')
    parser.add_argument('--size', type=int, nargs=2, default=None,
                        metavar=('H', 'W'),
                        help='image height and width (default: 192 256)')
    parser.add_argument('--sets', nargs='+',
                        choices=['det', 'seg', 'cls', 'rel'],
                        default=['det', 'seg'],
                        help='which sets: det (demo_coco), seg (demo_ade), '
                        'cls (demo_cls, classification for '
                        'tools/pretrain.py), rel (demo_rel, where a '
                        'triangle sits relative to a circle, for '
                        'tools/ablate_gates.py); default: det seg')
    parser.add_argument('--cls-train', type=int, default=900,
                        help='classification training images (default: 900)')
    parser.add_argument('--cls-val', type=int, default=150,
                        help='classification validation images '
                        '(default: 150)')
    parser.add_argument('--cls-size', type=int,
                        default=shape_classes.DEFAULT_IMAGE_SIZE,
                        help='classification image side (default: '
                        f'{shape_classes.DEFAULT_IMAGE_SIZE})')
    parser.add_argument('--rel-train', type=int,
                        default=relation_classes.DEFAULT_NUM_TRAIN,
                        help='relation training images (default: '
                        f'{relation_classes.DEFAULT_NUM_TRAIN})')
    parser.add_argument('--rel-val', type=int,
                        default=relation_classes.DEFAULT_NUM_VAL,
                        help='relation validation images (default: '
                        f'{relation_classes.DEFAULT_NUM_VAL})')
    parser.add_argument('--rel-size', type=int,
                        default=relation_classes.DEFAULT_IMAGE_SIZE,
                        help='relation image side (default: '
                        f'{relation_classes.DEFAULT_IMAGE_SIZE})')
    parser.add_argument('--force', action='store_true',
                        help='regenerate even if an identical set exists')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    size = tuple(args.size) if args.size else demo_data.DEFAULT_IMAGE_SIZE
    common = dict(seed=args.seed, image_size=size,
                  reuse_existing=not args.force)
    try:
        # (set, maker, folder, train/val counts, how the labels are read)
        dense_sets = (
            ('det', 'detection', demo_data.make_detection_set, 'demo_coco',
             args.det_train, args.det_val, 'COCO category ids 1..3'),
            ('seg', 'segmentation', demo_data.make_segmentation_set,
             'demo_ade', args.seg_train, args.seg_val,
             'label values 1..4, read with reduce_zero_label=True'))
        for key, kind, make, folder, train, val, labels in dense_sets:
            if key not in args.sets:
                continue
            made = make(osp.join(args.out, folder), num_train=train,
                        num_val=val, **common)
            demo_data._report(kind, made)
            print(f'  classes: {", ".join(made["classes"])} ({labels})')
        if 'cls' in args.sets:
            cls = shape_classes.make_classification_set(
                shape_classes.default_root(args.out),
                num_train=args.cls_train, num_val=args.cls_val,
                image_size=args.cls_size, seed=args.seed,
                reuse_existing=not args.force)
            done = 'kept the existing set' if cls['reused'] else \
                f'wrote it in {cls["seconds"]:.2f} s'
            print(f'classification: {cls["root"]}: {cls["num_train"]} train '
                  f'+ {cls["num_val"]} val images of {args.cls_size}x'
                  f'{args.cls_size}, classes {", ".join(cls["classes"])} '
                  f'(ImageFolder tree); {done}')
        if 'rel' in args.sets:
            rel = relation_classes.make_relation_set(
                relation_classes.default_root(args.out),
                num_train=args.rel_train, num_val=args.rel_val,
                image_size=args.rel_size, seed=args.seed,
                reuse_existing=not args.force)
            done = 'kept the existing set' if rel['reused'] else \
                f'wrote it in {rel["seconds"]:.2f} s'
            print(f'relations: {rel["root"]}: {rel["num_train"]} train + '
                  f'{rel["num_val"]} val images of {args.rel_size}x'
                  f'{args.rel_size}, classes {", ".join(rel["classes"])} '
                  f'(where the triangle is relative to the circle; '
                  f'ImageFolder tree); {done}')
    except ValueError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    print(f'done in {time.perf_counter() - start:.2f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
