"""PosMLP against timm's Swin-T and ResNet-50 on the same input: time per
call (CUDA events, warm-up, interleaved rounds, medians) and CUDA peak
memory, as rows of the benchmark's ``results`` table.

``fwd`` and ``fwdbwd`` are the benchmark's modes (``bench.measure
.make_step``): eval forward without autograd, and train-mode forward, the
sum of the first half of every level's channels, backward.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from torch import nn

from ..measure import make_input, make_step, set_mode
from .models import count_params
from .rows import Verdict
from .timing import MB, interleaved, ms, peak_memory


def compare(models: Dict[str, nn.Module], labels: Dict[str, str],
            shape: Tuple[int, int, int], mode: str, warmup: int,
            repeats: int, device: torch.device, seed: int
            ) -> Tuple[Verdict, List[dict]]:
    """The verdict (a table row) and one benchmark row per model."""
    batch, h, w = shape
    x = make_input((h, w), batch, device, seed)
    jobs, resets = {}, {}
    for name, model in models.items():
        set_mode(model, mode)
        step = make_step(model, mode)
        jobs[name] = (lambda step=step: step(x))
        resets[name] = (lambda model=model: model.zero_grad(set_to_none=True))
    try:
        runs = interleaved(jobs, warmup, repeats, device, resets)
        peaks = {}
        for name in models:  # one more call each, after the timed ones
            peaks[name] = peak_memory(jobs[name], device)
            resets[name]()
    finally:
        for model in models.values():
            set_mode(model, 'fwd')
    rows = []
    for name, model in models.items():
        run = runs[name]
        peak, growth = peaks[name]
        rows.append(dict(
            model=name, label=labels[name], size=[h, w], batch=batch,
            mode=mode, times=run['times'], warmup_times=run['warmup_times'],
            median_s=run['median_s'], min_s=run['min_s'],
            max_s=run['max_s'], images_per_s=batch / run['median_s'],
            peak_mem_mb=None if growth is None else growth / MB,
            max_memory_allocated_mb=None if peak is None else peak / MB,
            page_faults=None, params=count_params(model)))
    ours = rows[0]
    parts = []
    for row in rows:
        text = f"{row['label']} {ms(row['median_s'])}, {_memory(row)}"
        if row is not ours:
            text += (f", {ours['label']} at "
                     f"{ours['median_s'] / row['median_s']:.2f}x its time")
            theirs = row['max_memory_allocated_mb']
            if theirs:
                text += (f", "
                         f"{ours['max_memory_allocated_mb'] / theirs:.2f}x "
                         f"its memory")
        parts.append(text)
    detail = (f'median of {repeats} after {warmup} warm-up: '
              + ' | '.join(parts))
    return Verdict(True, detail, dict(rows=[
        {k: r[k] for k in ('model', 'mode', 'median_s',
                           'max_memory_allocated_mb')} for r in rows])), rows


def _memory(row: dict) -> str:
    mb = row['max_memory_allocated_mb']
    return ('memory not measured' if mb is None
            else f'max_memory_allocated {mb:.0f} MB')
