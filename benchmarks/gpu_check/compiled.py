"""torch.compile of a PosMLP training step: how long the first compiled
call takes, what a compiled step then costs against eager, and whether
the compiled step computes what eager does."""
from __future__ import annotations

import time
from typing import Tuple

import torch
from torch import nn

from ..measure import make_input
from .numerics import relative
from .rows import Verdict
from .timing import interleaved, ms
from .training import half_channel_loss

# Relative L2 difference allowed between compiled and eager outputs and
# gradients (fp32; the compiled kernels sum in another order and may fuse
# differently).
COMPILE_TOLERANCE = 1e-3


def compiled_step(model: nn.Module, shape: Tuple[int, int, int],
                  device: torch.device, backend: str, warmup: int,
                  repeats: int, seed: int) -> Verdict:
    """``model`` (no stochastic depth: eager and compiled must see the same
    network) in train mode: forward, ``half_channel_loss``, backward."""
    model = model.to(device).train()
    batch, h, w = shape
    x = make_input((h, w), batch, device, seed)

    def step(fn):
        model.zero_grad(set_to_none=True)
        outs = fn(x)
        half_channel_loss(outs).backward()
        return [o.detach() for o in outs]

    def grads():
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    eager_outs = step(model)
    eager_grads = grads()
    compiled = torch.compile(model, backend=backend)
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    compiled_outs = step(compiled)
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    first_call_s = time.perf_counter() - start
    out_err = max(relative(c, e) for c, e in zip(compiled_outs, eager_outs))
    grad_err = relative(grads(), eager_grads)
    runs = interleaved({'eager': lambda: step(model),
                        'compiled': lambda: step(compiled)},
                       warmup, repeats, device)
    eager_s, compiled_s = (runs[k]['median_s'] for k in ('eager', 'compiled'))
    problems = [f'{what} differ by {err:.2e} (limit '
                f'{COMPILE_TOLERANCE:.0e})'
                for what, err in (('outputs', out_err),
                                  ('gradients', grad_err))
                if not err <= COMPILE_TOLERANCE]
    detail = (f'backend {backend}: first call (compile + run) '
              f'{first_call_s:.1f} s; step eager {ms(eager_s)}, compiled '
              f'{ms(compiled_s)} ({compiled_s / eager_s:.2f}x; median of '
              f'{repeats} after {warmup} warm-up); compiled against eager: '
              f'outputs {out_err:.1e}, gradients {grad_err:.1e}')
    if problems:
        detail = '; '.join(problems) + '. ' + detail
    return Verdict(not problems, detail, dict(
        backend=backend, shape=list(shape), first_call_s=first_call_s,
        eager_median_s=eager_s, compiled_median_s=compiled_s,
        eager_times=runs['eager']['times'],
        compiled_times=runs['compiled']['times'],
        output_difference=out_err, gradient_difference=grad_err))
