"""Apply per-group token-mixing matrices to a window-partitioned token buffer.

This is the hot loop of the model. For each window class (see windows.py)
the gate provides P (groups, n, n) and a per-query bias (n,), and the gated
output is

    g[m, k] = (sum_n P[k % groups][m, n] * u[n, k] + bias[m]) * v[m, k]

The token buffer stores a class as (n, windows, channels), so after one
re-arrangement of u into (groups, n, windows * channels_per_group) the mixing
of every window of the class is a single batched matmul (baddbmm), and the
result is multiplied with v while it is put back into token order.
"""
from __future__ import annotations

from typing import Callable, Tuple

import torch

from .windows import WindowPlan

MixingFn = Callable[[Tuple[int, int, int, int]], Tuple[torch.Tensor,
                                                       torch.Tensor]]


def mix_tokens(u: torch.Tensor, v: torch.Tensor, plan: WindowPlan,
               batch: int, groups: int, mixing: MixingFn) -> torch.Tensor:
    """Gated token mixing of a (T, K) buffer; returns a (T, K) tensor.

    ``u`` and ``v`` are (T, K) (they may be strided halves of one tensor);
    channel k belongs to group ``k % groups`` as in the published code.
    """
    T, K = u.shape
    per_group = K // groups
    parts = []
    offset = 0
    for (n, windows), cls in zip(plan.class_sizes(batch), plan.classes):
        rows = n * windows
        u_c = u[offset:offset + rows].view(n, windows, per_group, groups)
        v_c = v[offset:offset + rows].view(n, windows, per_group, groups)
        weights, bias = mixing(cls.key)
        # (groups, n, windows * per_group): one matrix per group
        cols = u_c.permute(3, 0, 1, 2).reshape(groups, n, windows * per_group)
        if weights.dtype != cols.dtype:  # e.g. fp32 matrices, bf16 tokens
            weights, bias = weights.to(cols.dtype), bias.to(cols.dtype)
        mixed = torch.baddbmm(bias.view(1, n, 1), weights, cols)
        mixed = mixed.view(groups, n, windows, per_group).permute(1, 2, 3, 0)
        parts.append((v_c * mixed).reshape(rows, K))
        offset += rows
    return parts[0] if len(parts) == 1 else torch.cat(parts)
