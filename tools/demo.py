#!/usr/bin/env python
"""The out-of-the-box run: built-in data, a short CPU training, evaluation.

    python tools/demo.py                 # RetinaNet-PosMLP on shapes (COCO)
    python tools/demo.py --task seg      # Semantic FPN-PosMLP (ADE20K layout)
    python tools/demo.py --task all

For each task it writes the built-in dataset (tools/make_demo_data.py),
evaluates the freshly initialized model, trains it with tools/train.py,
evaluates the final checkpoint with tools/test.py (pycocotools' COCO mAP /
mmseg's mIoU) while drawing its predictions, and prints before/after
metrics. Everything goes under --work-dir (default work_dirs/demo).
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

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(HERE)
TASKS = {
    'det': dict(config='configs/demo/retinanet_posmlp_t_fpn_demo-shapes.py',
                metric='coco/bbox_mAP', name='RetinaNet-PosMLP box mAP'),
    'seg': dict(config='configs/demo/fpn_posmlp_t_demo-shapes.py',
                metric='mIoU', name='Semantic FPN-PosMLP mIoU'),
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--task', choices=['det', 'seg', 'all'],
                        default='det')
    parser.add_argument('--work-dir', default='work_dirs/demo')
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        help='passed on to train.py and test.py')
    return parser.parse_args()


def step(title: str):
    print(f'\n=== {title}', flush=True)


def run(args):
    print('$ ' + ' '.join(args), flush=True)
    subprocess.run([sys.executable] + args, check=True, cwd=ROOT)


def read_metrics(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


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
    options = ['--cfg-options'] + args.cfg_options if args.cfg_options else []
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
                before=read_metrics(untrained)[spec['metric']],
                after=read_metrics(trained)[spec['metric']],
                checkpoint=checkpoint, pictures=pictures)


def main():
    args = parse_args()
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
    main()
