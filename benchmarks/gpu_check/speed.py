"""PosMLP against timm's Swin-T and ResNet-50 on the same input: time per
call (interleaved rounds, medians) and CUDA peak memory, as the rows of a
benchmark report's ``results``."""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from torch import nn

from ..timed_steps import time_steps
from .rows import Verdict, ms


def compare(models: Dict[str, nn.Module], labels: Dict[str, str],
            shape: Tuple[int, int, int], mode: str, warmup: int,
            repeats: int, device: torch.device, seed: int
            ) -> Tuple[Verdict, List[dict]]:
    """The verdict (a table row) and one report row per model, PosMLP's
    first."""
    rows = time_steps(models, [('inference' if mode == 'fwd' else 'train',
                                shape)], repeats, warmup, device, seed,
                      labels=labels)
    ours, parts = rows[0], []
    for row in rows:
        mb = row['max_memory_allocated_mb']
        text = f"{row['label']} {ms(row['median_s'])}, " + (
            'memory not measured' if mb is None
            else f'max_memory_allocated {mb:.0f} MB')
        if row is not ours:
            text += (f", {ours['label']} at "
                     f"{ours['median_s'] / row['median_s']:.2f}x its time")
            if mb:
                text += (f", {ours['max_memory_allocated_mb'] / mb:.2f}x "
                         f"its memory")
        parts.append(text)
    return Verdict(True, f'median of {repeats} after {warmup} warm-up: '
                   + ' | '.join(parts), dict(rows=[
                       {k: r[k] for k in ('model', 'mode', 'median_s',
                                          'max_memory_allocated_mb')}
                       for r in rows])), rows
