"""Apply per-group token-mixing matrices to a window-partitioned token buffer.

This is the hot loop of the model. For each window class (see windows.py)
the gate provides P (groups, n, n) and a per-query bias (n,), and the gated
output is

    g[m, k] = (sum_n P[k % groups][m, n] * u[n, k] + bias[m]) * v[m, k]

The token buffer stores a class as (n, windows, channels), so after one
re-arrangement of u into (groups, n, windows * channels_per_group) the mixing
of every window of the class is a single batched matmul. The bias rides
along as an extra column of P against a row of ones under u (no separate
pass over the output), and the product with v is written straight back in
token order. Memory traffic per block: one copy of u, the matmul, one fused
multiply.
"""
from __future__ import annotations

from typing import Callable, Tuple

import torch

from .windows import WindowPlan

# key -> (groups, n, n + 1): the mixing matrices with the bias appended
AugmentedMixingFn = Callable[[Tuple[int, int, int, int]], torch.Tensor]


def mix_tokens(u: torch.Tensor, v: torch.Tensor, plan: WindowPlan,
               batch: int, groups: int,
               mixing: AugmentedMixingFn) -> torch.Tensor:
    """Gated token mixing of a (T, K) buffer; returns a contiguous (T, K).

    ``u`` and ``v`` are (T, K) (they may be strided halves of one tensor);
    channel k belongs to group ``k % groups`` as in the published code.
    """
    T, K = u.shape
    per_group = K // groups
    track_grad = torch.is_grad_enabled()
    # Without autograd every class writes into one output buffer; with it,
    # the classes are concatenated (in-place writes would break the graph).
    out = None if track_grad else v.new_empty(T, K)
    parts = []
    offset = 0
    for (n, windows), cls in zip(plan.class_sizes(batch), plan.classes):
        rows = n * windows
        u_c = u[offset:offset + rows].view(n, windows, per_group, groups)
        v_c = v[offset:offset + rows].view(n, windows, per_group, groups)
        weights = mixing(cls.key)
        if weights.dtype != u.dtype:  # e.g. fp32 matrices, bf16 tokens
            weights = weights.to(u.dtype)
        # (groups, n + 1, windows * per_group): u per group, then ones
        ones = u.new_ones(()).expand(groups, 1, windows, per_group)
        cols = torch.cat([u_c.permute(3, 0, 1, 2), ones], dim=1)
        mixed = torch.bmm(weights, cols.view(groups, n + 1, -1))
        mixed = mixed.view(groups, n, windows, per_group).permute(1, 2, 3, 0)
        if out is None:
            parts.append(torch.mul(v_c, mixed).view(rows, K))
        else:
            torch.mul(v_c, mixed, out=out[offset:offset + rows].view(
                n, windows, per_group, groups))
        offset += rows
    if out is not None:
        return out
    return parts[0] if len(parts) == 1 else torch.cat(parts)
