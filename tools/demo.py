#!/usr/bin/env python
"""The out-of-the-box run: built-in data, a short CPU training, evaluation.

    python tools/demo.py                 # RetinaNet-PosMLP on shapes (COCO)
    python tools/demo.py --task seg      # Semantic FPN-PosMLP (ADE20K layout)
    python tools/demo.py --task all
    python tools/demo.py --epochs 12            # a shorter detection run
    python tools/demo.py --task seg --iters 200
    python tools/demo.py --pretrained work_dirs/pretrain/custom/last.pth
    python tools/demo.py --scratch              # no pretrained backbone

For each task it writes the built-in dataset (tools/make_demo_data.py),
evaluates the freshly initialized model, trains it with tools/train.py,
evaluates the final checkpoint with tools/test.py (pycocotools' COCO mAP /
mmseg's mIoU) while drawing its predictions, and prints before/after
metrics. Everything goes under --work-dir (default work_dirs/demo).

The backbone starts from a pretraining on the built-in shape classes: the
demo runs tools/pretrain.py itself (minutes) into <work-dir>/pretrain, or
reuses the checkpoint there when the same command on the same data and code
made it (posmlp_dense.pretraining.run_key), and prints that command.
Detection also reports the share of the drawn boxes (score >= 0.5, the
boxes in the pictures) whose class is right at IoU >= 0.5
(posmlp_dense.analysis.drawn_labels).

``--epochs`` (detection) and ``--iters`` (segmentation) shorten or lengthen
the schedule: the loop length, the evaluation and checkpoint intervals and
the learning-rate schedule's end move together. A model that predicts
nothing above the score threshold (early in training) has an mAP of 0.0.
``--pretrained CKPT`` starts the backbone from another pretraining
checkpoint of the same small arch (tools/pretrain.py --arch-from-config on
the demo config); ``--scratch`` from random weights.
"""
import argparse
import glob
import json
import os
import os.path as osp
import subprocess
import sys
import time

from posmlp_dense.analysis.drawn_labels import drawn_label_share
from posmlp_dense.data import shape_classes
from posmlp_dense.data import shapes as demo_data
from posmlp_dense.known_warnings import hide_known_third_party_warnings
from posmlp_dense.pretraining import run_key
from posmlp_dense.pretraining.recipe import SHAPES_DEMO

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(HERE)
DET_CONFIG = 'configs/demo/retinanet_posmlp_t_fpn_demo-shapes.py'
TASKS = {
    'det': dict(config=DET_CONFIG,
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
    start = parser.add_mutually_exclusive_group()
    start.add_argument('--pretrained', default=None, metavar='CKPT',
                       help='initialize the backbone from this checkpoint '
                       "(init_cfg Pretrained) instead of the demo's own "
                       'pretraining')
    start.add_argument('--scratch', action='store_true',
                       help='train the backbone from random weights (no '
                       'pretraining)')
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


def pretrain_arguments(work_dir: str, data_dir: str = 'data') -> list:
    """The tools/pretrain.py arguments of the demo's own pretraining: the
    built-in shape classes, the short CPU recipe, the demo detector's
    backbone (the segmenter's is the same), one evaluation at the end."""
    return ['--data', shape_classes.default_root(data_dir),
            '--recipe', 'shapes-demo', '--arch-from-config', DET_CONFIG,
            '--eval-interval', str(SHAPES_DEMO.epochs),
            '--output', osp.join(work_dir, 'pretrain')]


def demo_pretraining(work_dir: str, data_dir: str = 'data') -> str:
    """The checkpoint of the demo's pretraining: an earlier run's when the
    same command on the same data and code made it, else a new run's."""
    step('pretrained backbone (built-in shape classes)')
    shape_classes.make_classification_set(
        shape_classes.default_root(data_dir))
    argv = pretrain_arguments(work_dir, data_dir)
    output = argv[argv.index('--output') + 1]
    key = run_key.run_key(argv)
    reusable, why = run_key.reuse_check(output, key)
    command = 'python tools/pretrain.py ' + ' '.join(argv)
    if reusable:
        print(f'reusing it: {why}:\n  {command}', flush=True)
    else:
        print(f'pretraining it ({why}), minutes on a CPU:', flush=True)
        run_key.forget(output)
        run([osp.join(HERE, 'pretrain.py')] + argv)
        run_key.record(output, key)
    return run_key.checkpoint_path(output)


def prediction_options(prefix: str) -> list:
    # CocoMetric writes <prefix>.bbox.json: the boxes as COCO results
    return [f'test_evaluator.outfile_prefix={osp.abspath(prefix)}']


def merged_config(config: str, options: list):
    """``config`` as train.py and test.py see it with ``--cfg-options
    OPTIONS``."""
    from mmengine.config import Config, DictAction
    cfg = Config.fromfile(osp.join(ROOT, config))
    if options:
        parser = argparse.ArgumentParser()
        parser.add_argument('--cfg-options', nargs='+', action=DictAction)
        cfg.merge_from_dict(
            parser.parse_args(['--cfg-options'] + options).cfg_options)
    return cfg


def nms_note(cfg) -> str:
    """How the detector's NMS treats overlapping boxes of other classes:
    a post-processing choice that the drawn-label share depends on."""
    nms = cfg.model.test_cfg.get('nms') or {}
    if nms.get('class_agnostic'):
        return ('class-agnostic NMS: of overlapping boxes only the '
                'best-scored is kept, whatever its class')
    return 'per-class NMS: overlapping boxes of other classes are all kept'


def label_share(cfg, prefix: str) -> dict:
    """drawn_label_share of the boxes test.py wrote with ``prefix``, at
    the score threshold the pictures are drawn with (``cfg``: the merged
    config)."""
    ann_file = cfg.test_evaluator['ann_file']
    score_thr = cfg.default_hooks.visualization.score_thr
    with open(osp.join(ROOT, ann_file)) as f:
        ground_truth = json.load(f)
    with open(f'{prefix}.bbox.json') as f:
        predictions = json.load(f)
    return drawn_label_share(ground_truth, predictions, score_thr=score_thr)


def describe_share(share: dict) -> str:
    if not share['drawn']:
        return 'no box drawn'
    return (f"{share['right']}/{share['drawn']} = {100 * share['share']:.1f}% "
            f"of the drawn boxes (score >= {share['score_thr']}) have the "
            f"right class at IoU >= {share['iou_thr']} ({share['wrong_class']}"
            f" wrong class, {share['duplicate']} duplicates, "
            f"{share['background']} on background; {share['missed']} of "
            f"{share['num_gt']} shapes not drawn)")


class PhaseClock:
    """The wall time of each phase of the demo: a phase lasts from its
    header to the next one's."""

    def __init__(self):
        self.phases = []  # (title, seconds)
        self._title, self._start = None, None

    def start(self, title: str):
        self.stop()
        print(f'\n=== {title}', flush=True)
        self._title, self._start = title, time.perf_counter()

    def stop(self):
        if self._start is not None:
            self.phases.append(
                (self._title, time.perf_counter() - self._start))
        self._title, self._start = None, None

    def total(self) -> float:
        return sum(seconds for _, seconds in self.phases)

    def report(self) -> str:
        width = max((len(title) for title, _ in self.phases), default=0)
        return '\n'.join(f'  {title:<{width}}  {seconds:6.0f} s'
                         for title, seconds in self.phases)


CLOCK = PhaseClock()


def step(title: str):
    CLOCK.start(title)


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


def cfg_options(options: list) -> list:
    return ['--cfg-options'] + options if options else []


def run_task(task: str, args, pretrained) -> dict:
    spec = TASKS[task]
    config = spec['config']
    work = osp.join(args.work_dir, task)
    length = args.epochs if task == 'det' else args.iters
    extra = schedule_options(config, length) if length else []
    if pretrained:
        extra += pretrained_options(pretrained)
    extra += args.cfg_options
    options = cfg_options(extra)
    boxes = {}  # detection: where test.py writes the predicted boxes
    if task == 'det':
        boxes = {when: osp.join(work, f'{when}_boxes')
                 for when in ('untrained', 'trained')}

    def test_options(when):
        if not boxes:
            return options
        return cfg_options(prediction_options(boxes[when]) + extra)

    step(f'{task}: evaluate the untrained model')
    untrained = osp.join(work, 'untrained_metrics.json')
    run([osp.join(HERE, 'test.py'), config, '--work-dir',
         osp.join(work, 'untrained'), '--out', untrained]
        + test_options('untrained'))
    step(f'{task}: train')
    print(f'config: {config}', flush=True)
    train_dir = osp.join(work, 'train')
    run([osp.join(HERE, 'train.py'), config, '--work-dir', train_dir]
        + options)
    checkpoint = last_checkpoint(train_dir)
    step(f'{task}: evaluate the trained model and draw its predictions')
    print(f'checkpoint: {checkpoint}', flush=True)
    trained = osp.join(work, 'metrics.json')
    pictures = osp.join(work, 'predictions')
    run([osp.join(HERE, 'test.py'), config, checkpoint, '--work-dir',
         osp.join(work, 'test'), '--out', trained, '--show-dir', pictures]
        + test_options('trained'))
    if task == 'seg':  # mmseg's visualizer saves under its backend's folder
        pictures = osp.join(pictures, 'vis_data', 'vis_image')
    result = dict(name=spec['name'], metric=spec['metric'],
                  before=read_metric(untrained, spec['metric']),
                  after=read_metric(trained, spec['metric']),
                  checkpoint=checkpoint, pictures=pictures)
    if boxes:
        cfg = merged_config(config, extra)
        result['shares'] = {when: label_share(cfg, prefix)
                            for when, prefix in boxes.items()}
        result['nms'] = nms_note(cfg)
        with open(osp.join(work, 'drawn_labels.json'), 'w') as f:
            json.dump(result['shares'], f, indent=1)
    return result


def main(argv=None):
    args = parse_args(argv)
    start = time.time()
    os.chdir(ROOT)
    step('built-in datasets')
    demo_data.make_demo_data('data')  # where the demo configs look
    tasks = ['det', 'seg'] if args.task == 'all' else [args.task]
    pretrained = args.pretrained
    if pretrained is None and not args.scratch:
        pretrained = demo_pretraining(args.work_dir)
    results = [run_task(task, args, pretrained) for task in tasks]
    CLOCK.stop()
    print(f'\n=== done in {(time.time() - start) / 60:.1f} min, by phase:')
    print(CLOCK.report())
    print(f"backbone: {pretrained or 'random initialization (--scratch)'}")
    for r in results:
        print(f"{r['name']}: untrained {r['before']:.3f} -> trained "
              f"{r['after']:.3f}")
        for when, share in r.get('shares', {}).items():
            print(f'  {when}: {describe_share(share)}')
        if 'nms' in r:
            print(f"  boxes after {r['nms']}")
        print(f"  checkpoint: {r['checkpoint']}")
        print(f"  predictions drawn in: {r['pictures']}")


if __name__ == '__main__':
    hide_known_third_party_warnings()
    main()
