"""A few PosMLP training steps on the device: forward, backward, AdamW, in
fp32, under bf16 autocast and under fp16 autocast with a GradScaler."""
from __future__ import annotations

import copy
from typing import Optional, Tuple

import torch
from torch import nn

from ..timing import MB, interleaved, peak_memory
from .numerics import autocast_supported
from .rows import Skip, Verdict

# fp16's GradScaler starts at this fixed scale (its default, 65536, is
# lowered at the first overflow, which is AMP working as designed); a
# lowered scale here means gradients reached fp16's range at a modest
# scale: a real overflow.
FP16_INIT_SCALE = 1024.0


def half_channel_loss(outs) -> torch.Tensor:
    """Mean of the first half of every level's channels, in fp32. (A
    function of layer-normalized outputs that is not constant while the
    norms' affine parameters are at their initial values.)"""
    return sum(o[:, :o.shape[1] // 2].float().mean() for o in outs)


def training_steps(base: nn.Module, shape: Tuple[int, int, int],
                   device: torch.device, dtype: Optional[torch.dtype],
                   steps: int, seed: int) -> Verdict:
    """``steps`` steps of a copy of ``base`` (train mode) on one batch;
    ``dtype``: None for fp32, else the autocast dtype."""
    if dtype is not None and not autocast_supported(device, dtype):
        raise Skip(f'{torch.cuda.get_device_name(device)} has no {dtype}')
    model = copy.deepcopy(base).to(device).train()
    batch, h, w = shape
    x = torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(
        seed)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                  weight_decay=0.05)
    scaler = torch.amp.GradScaler(device.type, init_scale=FP16_INIT_SCALE,
                                  enabled=dtype == torch.float16)
    before = [p.detach().clone() for p in model.parameters()]
    losses, problems = [], []

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32,
                            enabled=dtype is not None):
            loss = half_channel_loss(model(x))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        bad = [n for n, p in model.named_parameters()
               if p.grad is None or not torch.isfinite(p.grad).all()]
        if bad and not problems:
            problems.append(f'step {len(losses) + 1}: {len(bad)} parameters '
                            f'without a finite gradient, e.g. {bad[0]}')
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())

    # the first step creates the optimizer state: the training loop's peak
    peak = peak_memory(step, device).allocated
    times = interleaved({'step': step}, steps - 1, 0, device)['step'] \
        if steps > 1 else None
    if not all(map(lambda v: v == v and abs(v) != float('inf'), losses)):
        problems.append(f'losses {losses}')
    if scaler.is_enabled() and scaler.get_scale() < FP16_INIT_SCALE:
        problems.append(f'the GradScaler lowered its scale to '
                        f'{scaler.get_scale():g} (an fp16 overflow)')
    params = list(model.parameters())
    if not all(torch.isfinite(p).all() for p in params):
        problems.append('non-finite parameters after the steps')
    moved = sum(not torch.equal(p, b) for p, b in zip(params, before))
    if moved == 0:  # (a parameter whose gradient is exactly 0 may stay)
        problems.append('AdamW changed no parameter')
    median = times['median_s'] if times else None
    detail = (f'loss {" -> ".join(f"{v:.4g}" for v in losses)}; '
              f'{moved}/{len(params)} parameters updated; step '
              f'{median * 1e3 if median else float("nan"):.1f} ms (median '
              f'of steps 2-{steps}); '
              + ('memory not measured' if peak is None else
                 f'max_memory_allocated {peak / MB:.0f} MB')
              + (f'; scale {scaler.get_scale():g}' if scaler.is_enabled()
                 else ''))
    if problems:
        detail = '; '.join(problems) + '. ' + detail
    return Verdict(not problems, detail, dict(
        shape=list(shape), dtype=str(dtype or torch.float32), losses=losses,
        step_times=times and times['times'], median_s=median,
        max_memory_allocated_mb=None if peak is None else peak / MB,
        grad_scale=scaler.get_scale() if scaler.is_enabled() else None))
