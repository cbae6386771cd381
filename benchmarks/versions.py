"""This checkout's PosMLP against an earlier commit's (``git archive``,
imported under another name), in one process on the same weights and
input: a change smaller than a shared machine's drift shows only in the
paired ratio of interleaved rounds."""
from __future__ import annotations

import importlib
import os.path as osp
import subprocess
import sys
import tempfile
import types
from typing import Callable, Tuple

import torch
from torch import nn

from .environment import SOURCE_ROOT
from .targets import time_ratios
from .timing import interleaved

BASE_PACKAGE = 'posmlp_dense_base'
# largest relative difference of outputs (and input gradients) allowed
AGREEMENT = 1e-4


def import_base(revision: str, folder: str):
    """The PosMLP class of ``revision``'s posmlp_dense, unpacked into
    ``folder``."""
    archive = subprocess.run(
        ['git', '-C', SOURCE_ROOT, 'archive', revision, 'posmlp_dense'],
        capture_output=True)
    if archive.returncode:
        raise SystemExit(f'git archive {revision} failed: '
                         f'{archive.stderr.decode().strip()}')
    subprocess.run(['tar', '-x', '-C', folder], input=archive.stdout,
                   check=True)
    # a bare package: its modules import each other relatively
    package = types.ModuleType(BASE_PACKAGE)
    package.__path__ = [osp.join(folder, 'posmlp_dense')]
    sys.modules[BASE_PACKAGE] = package
    return importlib.import_module(BASE_PACKAGE + '.backbone').PosMLP


def versions_step(model: nn.Module, x: torch.Tensor, mode: str
                  ) -> Callable[[], Tuple[list, torch.Tensor]]:
    """A step returning (outputs, input gradient or None). In training the
    loss is a fixed random weighting of the outputs: rounding residue,
    which no two versions share, is all a constant loss would leave."""
    model.train(mode == 'train')
    if mode == 'inference':
        def step():
            with torch.no_grad():
                return model(x), None
        return step
    with torch.no_grad():
        shapes = [o.shape for o in model(x)]
    gen = torch.Generator().manual_seed(2)
    weights = [torch.randn(s, generator=gen) for s in shapes]

    def step():
        inp = x.clone().requires_grad_()
        outs = model(inp)
        sum((o * w).sum() for o, w in zip(outs, weights)).backward()
        model.zero_grad(set_to_none=True)
        return outs, inp.grad
    return step


def check_agreement(current: Callable, base: Callable) -> float:
    """The largest relative difference of the two steps' results; exits
    where it is beyond AGREEMENT: timing two different functions would
    mean nothing."""
    (outs_a, grad_a), (outs_b, grad_b) = current(), base()
    pairs = list(zip(outs_a, outs_b))
    if grad_a is not None:
        pairs.append((grad_a, grad_b))
    worst = max(((a.detach() - b.detach()).abs().max()
                 / b.detach().abs().max().clamp_min(1e-12)).item()
                for a, b in pairs)
    if not worst < AGREEMENT:
        raise SystemExit(f'the two versions compute different things '
                         f'(largest relative difference {worst:.2e}): not '
                         f'timed')
    return worst


def compare_versions(revision: str, mode: str, shape, arch, rounds: int,
                     warmup: int, seed: int = 0, log=print) -> dict:
    from posmlp_dense.backbone import PosMLP
    levels = tuple(range(len(arch['embed_dims']) if isinstance(arch, dict)
                         else 4))
    with tempfile.TemporaryDirectory() as folder:
        base_cls = import_base(revision, folder)
        torch.manual_seed(seed)
        # no stochastic depth: the same function twice
        current = PosMLP(arch, out_indices=levels, drop_path_rate=0.0)
        base = base_cls(arch, out_indices=levels, drop_path_rate=0.0)
        base.load_state_dict(current.state_dict(), strict=True)
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(
            seed + 1))
        steps = {'current': versions_step(current, x, mode),
                 'base': versions_step(base, x, mode)}
        worst = check_agreement(steps['current'], steps['base'])
        runs = interleaved(steps, rounds, warmup, log=log)
    return dict(base=revision, mode=mode, shape=list(shape), rounds=rounds,
                max_relative_difference=worst,
                threads=torch.get_num_threads(),
                current_median_s=runs['current']['median_s'],
                base_median_s=runs['base']['median_s'],
                times={k: r['times'] for k, r in runs.items()},
                **time_ratios(runs['current'], runs['base'], 'ratio'))
