"""Apply per-group token-mixing matrices to a window-partitioned token buffer.

This is the hot loop of the model. For each window class (see windows.py)
the gate provides P (groups, n, n) and a per-query bias (n,), and the gated
output is

    g[m, k] = (sum_n P[k % groups][m, n] * u[n, k] + bias[m]) * v[m, k]

The token buffer stores a class as (n, windows, channels), and the gate's
channels arrive group-major (channel g * channels_per_group + p; the block
permutes its projections so, see GateUnit.channel_order). One
re-arrangement of u into (groups, n, windows * channels_per_group), which
moves runs of channels_per_group contiguous values, then makes the mixing of
every window of the class a single batched matmul. The bias rides
along as an extra column of P against a row of ones under u (no separate
pass over the output), and the product with v is written straight back in
token order.

Without autograd (inference) nothing is allocated twice: the block's GELU
runs in place on the hidden tensor, and the gated product is written back
into v's storage.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torch import nn

from .windows import WindowPlan
from .workspace import Workspace

# key -> (groups, n, n + 1): the mixing matrices with the bias appended
AugmentedMixingFn = Callable[[Tuple[int, int, int, int]], torch.Tensor]


def mix_tokens(u: torch.Tensor, v: torch.Tensor, plan: WindowPlan,
               batch: int, groups: int, mixing: AugmentedMixingFn,
               activation: Optional[nn.Module] = None,
               workspace: Optional[Workspace] = None) -> torch.Tensor:
    """Gated token mixing of a (T, K) buffer; returns a (T, K) tensor.

    ``u`` and ``v`` are (T, K) (they may be strided halves of one tensor)
    with group-major channels: channel k belongs to group ``k // (K //
    groups)``.
    With an ``activation`` they are pre-activations and it is applied to
    both first. Without autograd the result is written into ``v``'s storage
    (the caller's own intermediate) and returned as a view of it, and the
    scratch buffers come from ``workspace`` when one is given.
    """
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        # (torch.compile fuses the out-of-place form by itself)
        if activation is not None:
            u, v = activation(u), activation(v)
        return _mix_with_autograd(u, v, plan, batch, groups, mixing)
    fuse_gelu = isinstance(activation, nn.GELU) and \
        activation.approximate == 'none'
    if activation is not None and not fuse_gelu:
        u, v = activation(u), activation(v)
    return _mix_in_place(u, v, plan, batch, groups, mixing, fuse_gelu,
                         workspace or Workspace())


def _class_views(u, v, plan, batch, groups):
    """(key, n, windows, u block, v block) per window class."""
    per_group = u.shape[1] // groups
    sizes = plan.class_sizes(batch)
    # split, not slicing: its backward concatenates the blocks' gradients
    # instead of zero-filling a full-size gradient for every block
    rows = [n * windows for n, windows in sizes]
    for (n, windows), cls, u_c, v_c in zip(sizes, plan.classes,
                                           u.split(rows), v.split(rows)):
        shape = (n, windows, groups, per_group)
        yield cls.key, n, windows, u_c.view(shape), v_c.view(shape)


def _mixing_input(u_c, n, windows, per_group, groups, out=None):
    """(groups, n + 1, windows, per_group): u per group, then ones."""
    ones = u_c.new_ones(()).expand(groups, 1, windows, per_group)
    if out is None:
        return torch.cat([u_c.permute(2, 0, 1, 3), ones], dim=1)
    return torch.cat([u_c.permute(2, 0, 1, 3), ones], dim=1, out=out)


def _matching_dtype(weights, cols):
    # e.g. fp32 matrices, bf16 tokens under autocast
    return weights if weights.dtype == cols.dtype else weights.to(cols.dtype)


def _mix(weights, cols, n, windows, per_group, groups):
    """(groups, n, n+1) @ (groups, n+1, cols) -> (n, windows, groups, V)."""
    mixed = torch.bmm(_matching_dtype(weights, cols),
                      cols.view(groups, n + 1, -1))
    return mixed.view(groups, n, windows, per_group).permute(1, 2, 0, 3)


def _mix_with_autograd(u, v, plan, batch, groups, mixing):
    T, K = u.shape
    per_group = K // groups
    parts = []
    for key, n, windows, u_c, v_c in _class_views(u, v, plan, batch, groups):
        cols = _mixing_input(u_c, n, windows, per_group, groups)
        mixed = _mix(mixing(key), cols, n, windows, per_group, groups)
        parts.append(torch.mul(v_c, mixed).view(n * windows, K))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _mix_in_place(u, v, plan, batch, groups, mixing, gelu, workspace):
    per_group = u.shape[1] // groups
    if gelu:  # in place, row by row: the fast, vectorized direction
        torch.ops.aten.gelu_(u)
        torch.ops.aten.gelu_(v)
    # one pair of buffers serves every class (each is done with them before
    # the next starts), allocated once at the largest class's size
    K = u.shape[1]
    sizes = plan.class_sizes(batch)
    workspace.reserve('cols', max((n + 1) * w for n, w in sizes) * K, u)
    workspace.reserve('mixed', max(n * w for n, w in sizes) * K, u)
    for key, n, windows, u_c, v_c in _class_views(u, v, plan, batch, groups):
        cols = _mixing_input(u_c, n, windows, per_group, groups, out=workspace.get(
            'cols', (groups, n + 1, windows, per_group), u))
        mixed = workspace.get('mixed', (groups, n, windows * per_group), u)
        torch.bmm(_matching_dtype(mixing(key), cols),
                  cols.view(groups, n + 1, -1), out=mixed)
        v_c.mul_(mixed.view(groups, n, windows, per_group).permute(1, 2, 0, 3))
    return v
