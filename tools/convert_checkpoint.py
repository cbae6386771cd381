#!/usr/bin/env python
"""Convert a released PosMLP ImageNet checkpoint to a backbone checkpoint.

    python tools/convert_checkpoint.py posmlp_t_imagenet.pth posmlp_t.pth
    python tools/convert_checkpoint.py SRC posmlp_t_w7.safetensors \
        --window-size 7          # tables resized for 7x7 windows everywhere

The result holds only the backbone's weights (classifier head and derived
buffers dropped; EMA weights by default, as the authors evaluate them), as
``.pth`` or ``.safetensors`` (by the output's extension). It loads with
``posmlp_dense.load_pretrained`` or an mmdet/mmseg ``init_cfg`` Pretrained.
The key report is printed. The input file is never modified, and an
existing output is only replaced with ``--overwrite``.
"""
import argparse
import json
import logging
import os.path as osp
import sys

from posmlp_dense import PosMLP
from posmlp_dense.checkpoint import (CheckpointError, extract_state_dict,
                                     infer_config, load_state,
                                     read_checkpoint, save_checkpoint,
                                     strip_prefix)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('src', help='released (or any PosMLP) checkpoint')
    parser.add_argument('dst', help='output file, .pth or .safetensors')
    parser.add_argument('--which', choices=['ema', 'raw'], default='ema',
                        help="'ema': state_dict_ema when present (default); "
                        "'raw': state_dict")
    parser.add_argument('--window-size', type=int, nargs='+', default=None,
                        help='resize for these windows: one value for all '
                        'levels, or one per level')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace an existing output file')
    return parser.parse_args(argv)


def convert(src, dst, which='ema', window_size=None, overwrite=False):
    if osp.abspath(src) == osp.abspath(dst):
        raise ValueError('the output must not be the input file')
    state, entry = extract_state_dict(read_checkpoint(src), which)
    state, prefix = strip_prefix(state, None)
    config = infer_config(state)
    if window_size is not None:
        config['window_size'] = window_size[0] if len(window_size) == 1 \
            else tuple(window_size)
    backbone = PosMLP(**config, out_norm=False)
    report = load_state(backbone, state, source=src, entry=entry,
                        prefix=prefix)
    windows = [list(level.window) for level in backbone.levels]
    meta = dict(source=osp.basename(src), entry=entry, gate=config['gate'],
                arch=json.dumps(config['arch']), windows=json.dumps(windows))
    save_checkpoint(backbone.state_dict(), dst, meta=meta,
                    overwrite=overwrite)
    return report, windows


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(message)s')
    try:
        report, windows = convert(args.src, args.dst, args.which,
                                  args.window_size, args.overwrite)
    except (CheckpointError, FileNotFoundError, FileExistsError,
            ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    print(f'wrote {args.dst}: {len(report.loaded)} backbone tensors, '
          f'windows {windows}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
