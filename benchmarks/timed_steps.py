"""Time and peak memory of backbone steps: the models of a step run
interleaved on the same input; one more call each, after the timed ones,
measures its peak memory, and for a training step one more the bytes
autograd saves."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .models import LABELS, count_params
from .steps import (STEP_MODES, SavedActivations, make_input, make_step,
                    set_mode, step_name)
from .timing import MB, interleaved, peak_memory


def _mb(value: Optional[int]) -> Optional[float]:
    return None if value is None else value / MB


def time_steps(models: Dict[str, nn.Module],
               steps: Sequence[Tuple[str, Sequence[int]]], repeats: int,
               warmup: int, device: torch.device, seed: int = 0,
               log: Optional[Callable[[str], None]] = None,
               labels: Optional[Dict[str, str]] = None) -> List[dict]:
    """A report row per model and (mode, (B, H, W)) of ``steps``, mode
    'inference' or 'train'; the models end in eval mode."""
    rows = []
    for mode, (batch, h, w) in steps:
        step_mode = STEP_MODES[mode]
        x = make_input((h, w), batch, device, seed)
        jobs, resets = {}, {}
        for name, model in models.items():
            set_mode(model, step_mode)
            step = make_step(model, step_mode)
            jobs[name] = lambda step=step: step(x)
            resets[name] = lambda m=model: m.zero_grad(set_to_none=True)
        what = step_name(mode, (batch, h, w))
        try:
            runs = interleaved(jobs, repeats, warmup, device, resets, log=log
                               and (lambda text: log(f'{what} {text}')))
            for name, model in models.items():
                memory = peak_memory(jobs[name], device)
                resets[name]()
                run = runs[name]
                row = dict(
                    model=name, label=(labels or LABELS).get(name, name),
                    size=[h, w], batch=batch, mode=step_mode,
                    times=run['times'], warmup_times=run['warmup_times'],
                    median_s=run['median_s'], min_s=run['min_s'],
                    max_s=run['max_s'], images_per_s=batch / run['median_s'],
                    peak_mem_mb=_mb(memory.peak),
                    max_memory_allocated_mb=_mb(memory.allocated),
                    params=count_params(model))
                if mode == 'train':
                    held = list(model.parameters()) + list(model.buffers())
                    with SavedActivations(exclude=held) as saved:
                        jobs[name]()
                    resets[name]()
                    row['saved_activation_mb_per_image'] = \
                        saved.activation_bytes / batch / MB
                rows.append(row)
        finally:
            for model in models.values():
                set_mode(model, 'fwd')
    return rows
