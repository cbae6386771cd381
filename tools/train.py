#!/usr/bin/env python
"""Train a detector (mmdet) or segmentor (mmseg) with a PosMLP backbone.

    python tools/train.py configs/retinanet_posmlp_s_fpn.py
    python tools/train.py CONFIG --work-dir DIR --resume [CKPT] --amp \
        --cfg-options train_dataloader.batch_size=4

The framework is read from the config. Multi-GPU / multi-node: see
tools/dist_train.sh and tools/slurm_train.sh (``--launcher pytorch|slurm``).
"""
import argparse

from posmlp_dense.known_warnings import hide_known_third_party_warnings
from posmlp_dense.openmmlab.runtime import launch, preflight


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='mmdet or mmseg config file')
    parser.add_argument('--work-dir', help='where logs and checkpoints go '
                        '(default: work_dirs/<config name>)')
    parser.add_argument('--resume', nargs='?', const='auto', default=None,
                        help='resume from CKPT, or with no value from the '
                        'last checkpoint in the work dir')
    parser.add_argument('--amp', action='store_true',
                        help='automatic mixed precision')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help="scale the LR with the total batch size "
                        "(needs the config's auto_scale_lr)")
    launch.add_common_arguments(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    launch.set_local_rank(args.local_rank)
    cfg = launch.load_config(args.config, args.cfg_options, args.work_dir,
                             args.launcher)
    if not args.skip_preflight:  # every missing file at once, exit status 2
        preflight.run(cfg, args.config, 'train', resume=args.resume)
    if args.amp:
        launch.enable_amp(cfg)
    if args.auto_scale_lr:
        if 'base_batch_size' not in cfg.get('auto_scale_lr', {}):
            raise ValueError('--auto-scale-lr needs auto_scale_lr.'
                             'base_batch_size in the config')
        cfg.auto_scale_lr.enable = True
    launch.set_resume(cfg, args.resume)
    launch.build_runner(cfg).train()


if __name__ == '__main__':
    hide_known_third_party_warnings()
    main()
