"""Command line of tools/pretrain.py: a run's settings and recipe overrides."""
from __future__ import annotations

import argparse
import os.path as osp
from typing import List, Optional

from .model_factory import MODELS, arch_from_config, parse_arch
from .recipe import recipe_for
from .trainer import RunSettings, pretrain

EXAMPLES = """\
examples:
  # PosMLP-S on ImageNet-1k with the published recipe, 8 GPUs
  torchrun --nproc_per_node=8 tools/pretrain.py --model posmlp_s \\
      --data /path/to/imagenet --output work_dirs/pretrain/posmlp_s
  # resume it after an interruption
  torchrun --nproc_per_node=8 tools/pretrain.py --model posmlp_s \\
      --data /path/to/imagenet --output work_dirs/pretrain/posmlp_s --resume
  # the demo detector's small backbone on the built-in shapes (CPU, minutes)
  python tools/make_demo_data.py --sets cls
  python tools/pretrain.py --data data/demo_cls --recipe shapes-demo \\
      --arch-from-config configs/demo/retinanet_posmlp_t_fpn_demo-shapes.py \\
      --output work_dirs/pretrain/demo
"""

# recipe field, flag, type, nargs, help
OVERRIDES = (
    ('epochs', '--epochs', int, None, 'training epochs (before cooldown)'),
    ('warmup_epochs', '--warmup-epochs', int, None, 'linear warmup epochs'),
    ('cooldown_epochs', '--cooldown-epochs', int, None,
     'epochs at min-lr after the cosine schedule'),
    ('batch_size', '--batch-size', int, None, 'images per process'),
    ('lr', '--lr', float, None, 'peak learning rate'),
    ('warmup_lr', '--warmup-lr', float, None, 'learning rate at step 0'),
    ('min_lr', '--min-lr', float, None, 'learning rate at the end'),
    ('weight_decay', '--weight-decay', float, None, 'AdamW weight decay'),
    ('clip_grad', '--clip-grad', float, None,
     'gradient norm clipping (0: off)'),
    ('img_size', '--img-size', int, None, 'training and evaluation size'),
    ('crop_pct', '--crop-pct', float, None, 'evaluation centre crop'),
    ('scale', '--scale', float, 2, "RandomResizedCrop's area range"),
    ('auto_augment', '--aa', str, None,
     "RandAugment policy ('none': off)"),
    ('re_prob', '--reprob', float, None, 'random erasing probability'),
    ('mixup', '--mixup', float, None, 'Mixup alpha (0: off)'),
    ('cutmix', '--cutmix', float, None, 'CutMix alpha (0: off)'),
    ('smoothing', '--smoothing', float, None, 'label smoothing'),
    ('drop_rate', '--drop', float, None, 'dropout before the head'),
    ('drop_path_rate', '--drop-path', float, None, 'stochastic depth'),
    ('model_ema_decay', '--model-ema-decay', float, None, 'EMA decay'),
    ('seed', '--seed', int, None, 'random seed (+ process rank)'),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description='ImageNet-1k pretraining of PosMLP-T/S/B classifiers '
        "with the authors' published recipe (timm's training components). "
        'Recipe settings default to those of --recipe; the flags below '
        'change them.',
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES)
    parser.add_argument('--data', required=True,
                        help='ImageFolder tree: DATA/train/<class>/*, '
                        'DATA/val/<class>/*')
    parser.add_argument('--model', choices=MODELS, default='posmlp_t',
                        help='architecture and published recipe '
                        '(posmlp_b: PosMLP-S\'s recipe, none was published)')
    parser.add_argument('--recipe', choices=['published', 'shapes-demo'],
                        default='published',
                        help="'published': the authors' recipe of --model; "
                        "'shapes-demo': a short CPU recipe for the built-in "
                        'shape classes (tools/make_demo_data.py --sets cls)')
    arch = parser.add_mutually_exclusive_group()
    arch.add_argument('--arch', type=parse_arch, default=None,
                      help='a custom architecture as JSON: PosMLP arguments '
                      '({"arch": {...}, "gate": ...}) or the arch dict')
    arch.add_argument('--arch-from-config', default=None, metavar='CONFIG',
                      help='the architecture of the PosMLP backbone of an '
                      'mmdet/mmseg config (its detector then loads the '
                      'weights key for key)')
    parser.add_argument('--output', default=None,
                        help='checkpoints and logs (default: '
                        'work_dirs/pretrain/<model>)')
    parser.add_argument('--resume', nargs='?', const='auto', default=None,
                        metavar='CKPT', help="resume from CKPT, or with no "
                        "value from the output folder's last.pth")
    parser.add_argument('--device', default=None,
                        help='cuda or cpu (default: cuda when available)')
    parser.add_argument('--amp', action=argparse.BooleanOptionalAction,
                        default=None, help='mixed precision (default: on '
                        'GPUs as published, fp16; off on CPUs, where --amp '
                        'means bf16)')
    parser.add_argument('--no-model-ema', action='store_true',
                        help='keep no EMA of the weights')
    parser.add_argument('--model-ema-warmup', action='store_true',
                        help="timm's EMA decay warmup (for short runs: the "
                        'published decay 0.99992 averages over ~12k steps)')
    parser.add_argument('--sched-on-updates', action='store_true',
                        help='step the LR schedule every update instead of '
                        'every epoch (for runs of few epochs)')
    parser.add_argument('--workers', type=int, default=None,
                        help='data loading processes per training process '
                        '(default: the recipe\'s 8)')
    parser.add_argument('--log-interval', type=int, default=50,
                        help='steps between log lines')
    parser.add_argument('--eval-interval', type=int, default=1,
                        help='epochs between evaluations and checkpoints')
    for field, flag, kind, nargs, text in OVERRIDES:
        parser.add_argument(flag, dest=field, type=kind, nargs=nargs,
                            default=None, help=text)
    return parser


def recipe_from_args(args: argparse.Namespace):
    changes = {}
    for field, _flag, _kind, nargs, _text in OVERRIDES:
        value = getattr(args, field)
        if value is not None:
            changes[field] = tuple(value) if nargs else value
    if changes.get('auto_augment', '').lower() == 'none':
        changes['auto_augment'] = None
    if changes.get('clip_grad') == 0:
        changes['clip_grad'] = None
    if args.no_model_ema:
        changes['model_ema'] = False
    if args.model_ema_warmup:
        changes['model_ema_warmup'] = True
    if args.sched_on_updates:
        changes['sched_on_updates'] = True
    if args.workers is not None:
        changes['workers'] = args.workers
    return recipe_for(args.model, args.recipe).replace(**changes)


def _check(args, parser):
    positive = ('epochs', 'batch_size', 'img_size')
    for name in positive:
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f'--{name.replace("_", "-")} must be positive')
    if args.log_interval <= 0 or args.eval_interval <= 0:
        parser.error('--log-interval and --eval-interval must be positive')


def main(argv: Optional[List[str]] = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check(args, parser)
    arch_kwargs = args.arch
    if args.arch_from_config:
        arch_kwargs = arch_from_config(args.arch_from_config)
    name = args.model if arch_kwargs is None else 'custom'
    output = args.output or osp.join('work_dirs', 'pretrain', name)
    run = RunSettings(data=args.data, output=output, model=args.model,
                      arch_kwargs=arch_kwargs, resume=args.resume,
                      device=args.device, amp=args.amp,
                      log_interval=args.log_interval,
                      eval_interval=args.eval_interval)
    return pretrain(run, recipe_from_args(args))
