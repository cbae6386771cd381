#!/usr/bin/env python
"""The out-of-the-box run: built-in data, a short CPU training, evaluation.

    python tools/demo.py                 # RetinaNet-PosMLP on shapes (COCO)
    python tools/demo.py --task seg      # Semantic FPN-PosMLP (ADE20K layout)
    python tools/demo.py --task all
    python tools/demo.py --epochs 12            # a shorter detection run
    python tools/demo.py --task seg --iters 200
    python tools/demo.py --pretrained work_dirs/pretrain/custom/last.pth

For each task it writes the built-in dataset (tools/make_demo_data.py),
evaluates the freshly initialized model, trains it with tools/train.py,
evaluates the final checkpoint with tools/test.py (pycocotools' COCO mAP /
mmseg's mIoU) while drawing its predictions, and prints before/after
metrics. Everything goes under --work-dir (default work_dirs/demo).

``--epochs`` (detection) and ``--iters`` (segmentation) shorten or lengthen
the schedule: the loop length, the evaluation and checkpoint intervals and
the learning-rate schedule's end move together. A model that predicts
nothing above the score threshold (early in training) has an mAP of 0.0.
``--pretrained CKPT`` starts the backbone from a pretraining checkpoint of
the same small arch (tools/pretrain.py --arch-from-config on the demo
config) instead of from scratch.
"""
import argparse
import glob
import json
import os
import os.path as osp
import subprocess
import sys
import time

from posmlp_dense.data import shapes as demo_data
from posmlp_dense.known_warnings import hide_known_third_party_warnings

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(HERE)
TASKS = {
    'det': dict(config='configs/demo/retinanet_posmlp_t_fpn_demo-shapes.py',
                metric='coco/bbox_mAP', name='RetinaNet-PosMLP box mAP',
                unit='epochs'),
    'seg': dict(config='configs/demo/fpn_posmlp_t_demo-shapes.py',
                metric='mIoU', name='Semantic FPN-PosMLP mIoU',
                unit='iterations'),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--task', choices=['det', 'seg', 'all'],
                        default='det')
    parser.add_argument('--work-dir', default='work_dirs/demo')
    parser.add_argument('--epochs', type=int, default=None,
                        help='detection: train this many epochs instead of '
                        "the config's")
    parser.add_argument('--iters', type=int, default=None,
                        help='segmentation: train this many iterations '
                        "instead of the config's")
    parser.add_argument('--pretrained', default=None, metavar='CKPT',
                        help='initialize the backbone from this checkpoint '
                        '(init_cfg Pretrained) instead of from scratch')
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        help='passed on to train.py and test.py (after the '
                        'options above, so they win)')
    args = parser.parse_args(argv)
    tasks = ['det', 'seg'] if args.task == 'all' else [args.task]
    for flag, value, task in (('--epochs', args.epochs, 'det'),
                              ('--iters', args.iters, 'seg')):
        if value is None:
            continue
        if value <= 0:
            parser.error(f'{flag} must be positive, got {value}')
        if task not in tasks:
            parser.error(f'{flag} sets the {TASKS[task]["unit"]} of the '
                         f'{task} demo, which --task {args.task} does not '
                         f'run (the {tasks[0]} demo counts '
                         f'{TASKS[tasks[0]]["unit"]})')
    if args.pretrained is not None and not osp.isfile(args.pretrained):
        parser.error(f'--pretrained: checkpoint not found: '
                     f'{args.pretrained}')
    return args


def schedule_options(config: str, length: int) -> list:
    """``--cfg-options`` that make a demo config train ``length`` epochs
    (epoch-based loop) or iterations (iteration-based loop).

    The loop length, the validation and checkpoint intervals and the end of
    every LR scheduler that ends with the loop (in the loop's unit) move to
    ``length``; a warmup that would not end before ``length`` is shortened
    to a fifth of it.
    """
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(ROOT, config))
    by_epoch = 'max_epochs' in cfg.train_cfg
    key = 'max_epochs' if by_epoch else 'max_iters'
    old = cfg.train_cfg[key]
    options = [f'train_cfg.{key}={length}',
               f'train_cfg.val_interval={length}',
               f'default_hooks.checkpoint.interval={length}']
    schedulers = cfg.get('param_scheduler') or []
    same_unit = [(i, s) for i, s in enumerate(schedulers)
                 if s.get('by_epoch', True) == by_epoch]
    # a boundary between two schedulers (warmup end) past the new length
    boundaries = {s.get('begin', 0) for _, s in same_unit} - {0}
    moved = {b: max(1, length // 5) for b in boundaries if b >= length}
    for i, sched in same_unit:
        begin, end = sched.get('begin', 0), sched.get('end')
        if end == old:
            options.append(f'param_scheduler.{i}.end={length}')
        elif end in moved:
            options.append(f'param_scheduler.{i}.end={moved[end]}')
        if begin in moved:
            options.append(f'param_scheduler.{i}.begin={moved[begin]}')
    return options


def pretrained_options(checkpoint: str) -> list:
    # the demo backbone has init_cfg=None; _delete_ replaces it by a dict
    return ['model.backbone.init_cfg._delete_=True',
            'model.backbone.init_cfg.type=Pretrained',
            f'model.backbone.init_cfg.checkpoint={osp.abspath(checkpoint)}']


def step(title: str):
    print(f'\n=== {title}', flush=True)


def run(args):
    print('$ ' + ' '.join(args), flush=True)
    subprocess.run([sys.executable] + args, check=True, cwd=ROOT)


def read_metric(path: str, key: str) -> float:
    """``key`` of a metrics file written by test.py.

    mmdet's CocoMetric returns no metrics at all when the model predicted
    no box above the score threshold (an untrained or barely trained
    model): that is an mAP of 0.0.
    """
    with open(path) as f:
        metrics = json.load(f)
    if key in metrics:
        return float(metrics[key])
    if not metrics:
        print(f'(no predictions in {path}: {key} is 0.0)', flush=True)
        return 0.0
    raise KeyError(f'{path} has no {key!r}; it holds {sorted(metrics)}')


def last_checkpoint(work_dir: str) -> str:
    marker = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(marker):
        with open(marker) as f:
            return f.read().strip()
    found = sorted(glob.glob(osp.join(work_dir, '*.pth')), key=osp.getmtime)
    if not found:
        raise FileNotFoundError(f'training wrote no checkpoint in {work_dir}')
    return found[-1]


def run_task(task: str, args) -> dict:
    spec = TASKS[task]
    config = spec['config']
    work = osp.join(args.work_dir, task)
    length = args.epochs if task == 'det' else args.iters
    extra = schedule_options(config, length) if length else []
    if args.pretrained:
        extra += pretrained_options(args.pretrained)
    extra += args.cfg_options
    options = ['--cfg-options'] + extra if extra else []
    step(f'{task}: evaluate the untrained model')
    untrained = osp.join(work, 'untrained_metrics.json')
    run([osp.join(HERE, 'test.py'), config, '--work-dir',
         osp.join(work, 'untrained'), '--out', untrained] + options)
    step(f'{task}: train ({config})')
    train_dir = osp.join(work, 'train')
    run([osp.join(HERE, 'train.py'), config, '--work-dir', train_dir]
        + options)
    checkpoint = last_checkpoint(train_dir)
    step(f'{task}: evaluate {checkpoint} and draw its predictions')
    trained = osp.join(work, 'metrics.json')
    pictures = osp.join(work, 'predictions')
    run([osp.join(HERE, 'test.py'), config, checkpoint, '--work-dir',
         osp.join(work, 'test'), '--out', trained, '--show-dir', pictures]
        + options)
    return dict(name=spec['name'], metric=spec['metric'],
                before=read_metric(untrained, spec['metric']),
                after=read_metric(trained, spec['metric']),
                checkpoint=checkpoint, pictures=pictures)


def main(argv=None):
    args = parse_args(argv)
    start = time.time()
    os.chdir(ROOT)
    step('built-in datasets')
    demo_data.make_demo_data('data')  # where the demo configs look
    tasks = ['det', 'seg'] if args.task == 'all' else [args.task]
    results = [run_task(task, args) for task in tasks]
    step(f'done in {(time.time() - start) / 60:.1f} min')
    for r in results:
        print(f"{r['name']}: untrained {r['before']:.3f} -> trained "
              f"{r['after']:.3f}")
        print(f"  checkpoint: {r['checkpoint']}")
        print(f"  predictions drawn in: {r['pictures']}")


if __name__ == '__main__':
    hide_known_third_party_warnings()
    main()
