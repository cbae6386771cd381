"""The benchmark's torch.compile figures: PosMLP-T's training step compiled
as a user compiles it for varying input sizes (``dynamic=True``, or the
default ``dynamic=None``), on the benchmark's device. The measurement is
the GPU check's compile row (benchmarks.gpu_check.compiled): first-call
time, eager and compiled step times, how many graphs the sizes took, and
the compiled step's difference from eager."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from posmlp_dense.backbone import PosMLP

from .gpu_check.compiled import compiled_step
from .measure import log


def run_compiled(shape: Tuple[int, int, int], sizes: Sequence[Tuple[int, int]],
                 device: torch.device, backend: str,
                 dynamic: Optional[bool], warmup: int,
                 repeats: int, seed: int, posmlp_arch=None,
                 start: Optional[float] = None) -> dict:
    """``shape`` (B, H, W) of the timed step; ``sizes`` (H, W) run after
    it, which must reuse its graph (under ``dynamic=None``, the graph the
    first of them compiles)."""
    torch.manual_seed(seed)
    # no stochastic depth: eager and compiled must run the same network
    model = PosMLP(posmlp_arch or 't', out_indices=(0, 1, 2, 3),
                   drop_path_rate=0.0)
    log(f'torch.compile ({backend}, dynamic={dynamic}): PosMLP training '
        f'step at {shape[0]}x3x{shape[1]}x{shape[2]}, then {len(sizes)} '
        f'further sizes', start)
    verdict = compiled_step(model, shape, device, backend, warmup, repeats,
                            seed, sizes, dynamic=dynamic)
    log(('ok: ' if verdict.passed else 'FAILED: ') + verdict.detail, start)
    return dict(passed=verdict.passed, detail=verdict.detail,
                label='PosMLP-T' if posmlp_arch is None else
                'PosMLP (custom arch)', **verdict.figures)
