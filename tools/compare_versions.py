#!/usr/bin/env python
"""Time this checkout's PosMLP against an earlier commit's, in one process.

    python tools/compare_versions.py --base HEAD~1                 # training
    python tools/compare_versions.py --base f1de925 --mode inference \
        --shape 1x3x800x1333 --rounds 12

On a shared machine the speed drifts by more than a small change of the
model makes, even between two benchmark runs minutes apart. Here both
versions run in the same process, on the same weights and the same input,
alternating step by step (the order flips every round), and the result is
the median of the per-round ratios: a drift of the machine's speed cancels
out of each ratio.

The base commit's ``posmlp_dense`` is extracted with ``git archive`` into a
temporary folder and imported under another name (its ``__init__`` is not
run, so nothing is registered twice). Before timing, both versions' outputs
(and, in training, the input gradients) are compared: timing two models that
compute different things would mean nothing, so a difference beyond float
rounding stops the run.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time
import types

import torch

from benchmarks.cli_sizes import input_shape

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
BASE_PACKAGE = 'posmlp_dense_base'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--base', required=True,
                   help='the commit (or any git revision) to compare with')
    p.add_argument('--mode', choices=('train', 'inference'), default='train',
                   help='train: forward + backward of a fixed random '
                        'weighting of the outputs, train mode; inference: '
                        'eval, no_grad')
    p.add_argument('--shape', type=input_shape, default='2x3x512x512',
                   help='BxCxHxW')
    p.add_argument('--arch', default='t',
                   help="a variant name or a JSON arch dict")
    p.add_argument('--rounds', type=int, default=8)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--json', help='also write the result to this file')
    args = p.parse_args(argv)
    if args.arch.startswith('{'):
        args.arch = json.loads(args.arch)
    if args.rounds < 1:
        p.error('--rounds must be at least 1')
    return args


def import_base(revision: str, folder: str):
    """The PosMLP class of ``revision``'s posmlp_dense, imported from
    ``folder`` as BASE_PACKAGE."""
    archive = subprocess.run(
        ['git', '-C', ROOT, 'archive', revision, 'posmlp_dense'],
        capture_output=True)
    if archive.returncode:
        raise SystemExit(f'git archive {revision} failed: '
                         f'{archive.stderr.decode().strip()}')
    subprocess.run(['tar', '-x', '-C', folder], input=archive.stdout,
                   check=True)
    # a bare package object: its modules import each other relatively, and
    # its __init__ (the framework registrations) stays unrun
    package = types.ModuleType(BASE_PACKAGE)
    package.__path__ = [osp.join(folder, 'posmlp_dense')]
    sys.modules[BASE_PACKAGE] = package
    return importlib.import_module(BASE_PACKAGE + '.backbone').PosMLP


def build_pair(base_cls, arch, seed):
    from posmlp_dense.backbone import PosMLP
    # every level's output; no stochastic depth (the same function twice)
    levels = tuple(range(len(arch['embed_dims']) if isinstance(arch, dict)
                         else 4))
    torch.manual_seed(seed)
    current = PosMLP(arch, out_indices=levels, drop_path_rate=0.0)
    base = base_cls(arch, out_indices=levels, drop_path_rate=0.0)
    base.load_state_dict(current.state_dict(), strict=True)
    return current, base


def make_step(model, x, mode):
    if mode == 'inference':
        model.eval()

        def step():
            with torch.no_grad():
                return model(x), None
    else:
        model.train()
        with torch.no_grad():
            shapes = [o.shape for o in model(x)]
        # a fixed random weighting of the outputs: the sum of squares of
        # layer-normalized outputs would be constant at initialization
        # (its gradient pure rounding residue, which no two versions share)
        generator = torch.Generator().manual_seed(2)
        weights = [torch.randn(shape, generator=generator) for shape in shapes]

        def step():
            inp = x.clone().requires_grad_()
            outs = model(inp)
            sum((o * w).sum() for o, w in zip(outs, weights)).backward()
            model.zero_grad(set_to_none=True)
            return outs, inp.grad
    return step


def check_agreement(current_step, base_step):
    """Both versions' outputs (and input gradients) agree to float
    rounding; returns the largest relative difference."""
    (outs_a, grad_a), (outs_b, grad_b) = current_step(), base_step()
    pairs = list(zip(outs_a, outs_b))
    if grad_a is not None:
        pairs.append((grad_a, grad_b))
    worst = 0.0
    for a, b in pairs:
        scale = b.detach().abs().max().clamp_min(1e-12)
        worst = max(worst, ((a.detach() - b.detach()).abs().max()
                            / scale).item())
    if not worst < 1e-4:
        raise SystemExit(f'the two versions compute different things (largest '
                         f'relative difference {worst:.2e}): not timed')
    return worst


def time_pair(current_step, base_step, rounds, warmup):
    times = {'current': [], 'base': []}
    steps = {'current': current_step, 'base': base_step}
    for _ in range(warmup):
        current_step()
        base_step()
    for r in range(rounds):
        order = ('current', 'base') if r % 2 == 0 else ('base', 'current')
        for name in order:
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
    return times


def summarize(times):
    ratios = sorted(c / b for c, b in zip(times['current'], times['base']))
    return {
        'current_median_s': statistics.median(times['current']),
        'base_median_s': statistics.median(times['base']),
        'ratio_paired': statistics.median(ratios),
        'ratio_range': [ratios[0], ratios[-1]],
        'ratios': ratios,
        'times': times,
    }


def main(argv=None):
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        base_cls = import_base(args.base, folder)
        current, base = build_pair(base_cls, args.arch, args.seed)
        x = torch.randn(args.shape, generator=torch.Generator().manual_seed(
            args.seed + 1))
        current_step = make_step(current, x, args.mode)
        base_step = make_step(base, x, args.mode)
        difference = check_agreement(current_step, base_step)
        result = summarize(time_pair(current_step, base_step, args.rounds,
                                     args.warmup))
    result.update(base=args.base, mode=args.mode, shape=list(args.shape),
                  rounds=args.rounds, max_relative_difference=difference,
                  threads=torch.get_num_threads())
    print(f'{args.mode} {"x".join(map(str, args.shape))}, {args.rounds} '
          f'rounds, {result["threads"]} threads; outputs agree to '
          f'{difference:.1e} relative')
    print(f'  this checkout: median {result["current_median_s"]:.3f} s')
    print(f'  {args.base}: median {result["base_median_s"]:.3f} s')
    low, high = result['ratio_range']
    print(f'  this checkout / {args.base}: {result["ratio_paired"]:.3f} '
          f'(median of the per-round ratios; range {low:.3f}-{high:.3f})')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == '__main__':
    main()
