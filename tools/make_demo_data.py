#!/usr/bin/env python
"""Make the built-in demo datasets (COCO-format shapes + ADE20K-layout shapes).

    python tools/make_demo_data.py      # -> data/demo_coco, data/demo_ade
    python tools/make_demo_data.py --seed 1 --det-train 256 --size 160 224

A set that is already there with the same seed and parameters is kept unless
``--force``; one made with other parameters is regenerated in place.
"""
from __future__ import annotations

import argparse
import sys
import time

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
    parser.add_argument('--det-train', type=int, default=128,
                        help='detection training images (default: 128)')
    parser.add_argument('--det-val', type=int, default=32,
                        help='detection validation images (default: 32)')
    parser.add_argument('--seg-train', type=int, default=128,
                        help='segmentation training images (default: 128)')
    parser.add_argument('--seg-val', type=int, default=32,
                        help='segmentation validation images (default: 32)')
    parser.add_argument('--size', type=int, nargs=2, default=None,
                        metavar=('H', 'W'),
                        help='image height and width (default: 192 256)')
    parser.add_argument('--force', action='store_true',
                        help='regenerate even if an identical set exists')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    size = tuple(args.size) if args.size else demo_data.DEFAULT_IMAGE_SIZE
    try:
        result = demo_data.make_demo_data(
            args.out, seed=args.seed, det_train=args.det_train,
            det_val=args.det_val, seg_train=args.seg_train,
            seg_val=args.seg_val, image_size=size, force=args.force,
            verbose=True)
    except ValueError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    det, seg = result['detection'], result['segmentation']
    print(f'detection classes:    {", ".join(det["classes"])} '
          '(COCO category ids 1..3)')
    print(f'segmentation classes: {", ".join(seg["classes"])} '
          '(label values 1..4, read with reduce_zero_label=True)')
    print(f'done in {time.perf_counter() - start:.2f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
