#!/usr/bin/env python
"""Evaluate a checkpoint of a PosMLP detector (mmdet) or segmentor (mmseg).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--show-dir DIR]
        [--out metrics.json] [--cfg-options ...] [--launcher pytorch]

Prints the metrics of the config's test evaluator (COCO mAP, mIoU, ...).
"""
import argparse
import json
import os
import os.path as osp

from posmlp_dense.known_warnings import hide_known_third_party_warnings
from posmlp_dense.openmmlab.runtime import launch, preflight


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='mmdet or mmseg config file')
    parser.add_argument('checkpoint', nargs='?', default=None,
                        help="checkpoint to evaluate (omit to evaluate the "
                        "config's model initialized as training starts it: "
                        "its init_cfg, e.g. a pretrained backbone)")
    parser.add_argument('--work-dir', help='where logs go')
    parser.add_argument('--out', help='write the metrics to this JSON file')
    parser.add_argument('--show-dir', help='save pictures of the '
                        'predictions in this folder')
    launch.add_common_arguments(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    launch.set_local_rank(args.local_rank)
    cfg = launch.load_config(args.config, args.cfg_options, args.work_dir,
                             args.launcher)
    if not args.skip_preflight:  # every missing file at once, exit status 2
        preflight.run(cfg, args.config, 'test', checkpoint=args.checkpoint)
    if args.checkpoint is not None and not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    cfg.load_from = args.checkpoint
    cfg.resume = False
    if args.show_dir:
        launch.enable_visualization(cfg, osp.abspath(args.show_dir))
    runner = launch.build_runner(cfg)
    if args.checkpoint is None:  # the model as training would start it
        launch.initialize_like_training(runner)
    metrics = runner.test()
    if runner.rank == 0:
        text = json.dumps({k: float(v) for k, v in metrics.items()}, indent=2)
        print(text)
        if args.out:
            os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
            with open(args.out, 'w') as f:
                f.write(text + '\n')


if __name__ == '__main__':
    hide_known_third_party_warnings()
    main()
