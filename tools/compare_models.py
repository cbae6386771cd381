#!/usr/bin/env python
"""Time backbones against each other, each in a process of its own.

    python tools/compare_models.py                      # training, 2x3x512x512
    python tools/compare_models.py --mode inference --shape 1x3x800x1333 \
        --rounds 15

The benchmark (tools/benchmark.py) runs the models of a row in one process.
On a CPU that couples them through the allocator: glibc's malloc serves a
large request from memory another model freed when there is such a block,
and maps fresh pages from the OS (faulted in one by one, at every call)
when there is not, so a model's time depends on which models ran before it
in the process. Here every model has its own process, as it would in a
user's job, and a coordinator alternates their steps (the order flips
every round), so that a drift of the machine's speed is shared. It reports
each model's median and fastest step, its minor page faults per step, and
the first model's ratios to the others: of the medians, of the fastest
steps, and paired (the median of the round-by-round ratios).

A training step is train mode, forward, a fixed random weighting of every
returned level's output as the loss, backward (the gradients are then
those of a real loss; the sum of squares of layer-normalized outputs has
none to speak of). Inference is eval mode without autograd.
"""
from __future__ import annotations

import argparse
import json

from benchmarks.cli_sizes import input_shape
from benchmarks.isolated import compare_in_processes


def parse_args(argv=None):
    from benchmarks.models import ALL_MODELS
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--models', default='posmlp_t,swin_t',
                   help='comma list from ' + ','.join(ALL_MODELS) +
                        '; the first is compared with the others')
    p.add_argument('--mode', choices=('train', 'inference'), default='train')
    p.add_argument('--shape', type=input_shape, default='2x3x512x512',
                   help='BxCxHxW')
    p.add_argument('--rounds', type=int, default=9)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--json', help='also write the result to this file')
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(',') if m]
    unknown = [m for m in args.models if m not in ALL_MODELS]
    if unknown or len(args.models) < 2:
        p.error(f'--models: need two or more of {", ".join(ALL_MODELS)}; '
                f'got {",".join(args.models)}')
    if args.rounds < 1 or args.warmup < 0:
        p.error('--rounds must be >= 1 and --warmup >= 0')
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        result = compare_in_processes(args.models, args.mode, args.shape,
                                      args.rounds, args.warmup, args.seed)
    except RuntimeError as e:
        raise SystemExit(f'compare_models: {e}')
    print(f"{args.mode}, {'x'.join(map(str, args.shape))}, {args.rounds} "
          f"rounds, one process per model:")
    for name, m in result['models'].items():
        faults = '-' if m['page_faults'] is None else m['page_faults']
        print(f"  {name:<15s} median {m['median_s']:.3f} s, fastest "
              f"{m['min_s']:.3f} s, {faults} page faults per step")
    for name, r in result['ratios'].items():
        print(f"  {args.models[0]} / {name}: {r['medians']:.3f} (medians), "
              f"{r['paired']:.3f} (paired), {r['fastest']:.3f} (fastest)")
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == '__main__':
    main()
