"""Apply per-group token-mixing matrices to a window-partitioned token buffer.

This is the hot loop of the model. For each run of windows of one class (see
windows.py) the gate provides P (groups, n, n) and a per-query bias (n,), and
the gated output is

    g[m, k] = (sum_n P[group(k)][m, n] * u[n, k] + bias[m]) * v[m, k]

The token buffer stores a run as (windows, n, channels), and the gate's
channels arrive group-major (channel g * channels_per_group + p; the block
permutes its projections so, see GateUnit.channel_order). One
re-arrangement of u into (groups, n, windows * channels_per_group), which
moves runs of channels_per_group contiguous values, then makes the mixing of
every window of the run a single batched matmul. The bias rides along as an
extra column of P against a row of ones under u (no separate pass over the
output), and the product with v is written straight back in token order.

Without autograd (inference) the gated product is written back into v's
storage, and the scratch buffers are reused from run to run.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch

from .windows import WindowRun
from .workspace import Workspace

# key -> (groups, n, n + 1): the mixing matrices with the bias appended
AugmentedMixingFn = Callable[[Tuple[int, int, int, int]], torch.Tensor]


def mix_tokens(u: torch.Tensor, v: torch.Tensor, runs: Sequence[WindowRun],
               groups: int, mixing: AugmentedMixingFn,
               workspace: Optional[Workspace] = None) -> torch.Tensor:
    """Gated token mixing of a (T, K) buffer; returns a (T, K) tensor.

    ``u`` and ``v`` are (T, K) (they may be strided halves of one tensor)
    whose rows are the ``runs``, in order, and whose channels are
    group-major: channel k belongs to group ``k // (K // groups)``.
    Without autograd the result is written into ``v``'s storage (the
    caller's own intermediate) and returned as a view of it, and the scratch
    buffers come from ``workspace`` when one is given.
    """
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        # (torch.compile fuses the out-of-place form by itself)
        return _mix_with_autograd(u, v, runs, groups, mixing)
    return _mix_in_place(u, v, runs, groups, mixing, workspace or Workspace())


def _run_views(u, v, runs, groups):
    """(run, u block, v block) per run, blocks (windows, n, groups, V)."""
    per_group = u.shape[1] // groups
    # split, not slicing: its backward concatenates the blocks' gradients
    # instead of zero-filling a full-size gradient for every block
    rows = [run.rows for run in runs]
    for run, u_r, v_r in zip(runs, u.split(rows), v.split(rows)):
        shape = (run.windows, run.n, groups, per_group)
        yield run, u_r.view(shape), v_r.view(shape)


def _mixing_input(u_r, out=None):
    """(groups, n + 1, windows, V): u per group, then a row of ones."""
    windows, _, groups, per_group = u_r.shape
    ones = u_r.new_ones(()).expand(groups, 1, windows, per_group)
    if out is None:
        return torch.cat([u_r.permute(2, 1, 0, 3), ones], dim=1)
    return torch.cat([u_r.permute(2, 1, 0, 3), ones], dim=1, out=out)


def _matching_dtype(weights, cols):
    # e.g. fp32 matrices, bf16 tokens under autocast
    return weights if weights.dtype == cols.dtype else weights.to(cols.dtype)


def _token_order(mixed, run, per_group):
    """(groups, n, windows * V) matmul result -> (windows, n, groups, V)."""
    groups = mixed.shape[0]
    return mixed.view(groups, run.n, run.windows, per_group).permute(
        2, 1, 0, 3)


def _mix_with_autograd(u, v, runs, groups, mixing):
    K = u.shape[1]
    per_group = K // groups
    parts = []
    for run, u_r, v_r in _run_views(u, v, runs, groups):
        cols = _mixing_input(u_r)
        mixed = torch.bmm(_matching_dtype(mixing(run.key), cols),
                          cols.view(groups, run.n + 1, -1))
        gated = torch.mul(v_r, _token_order(mixed, run, per_group))
        parts.append(gated.view(run.rows, K))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _mix_in_place(u, v, runs, groups, mixing, workspace):
    K = u.shape[1]
    per_group = K // groups
    # one pair of buffers serves every run (each is done with them before
    # the next starts), allocated once at the largest run's size
    workspace.reserve('cols', max((r.n + 1) * r.windows for r in runs) * K, u)
    workspace.reserve('mixed', max(r.rows for r in runs) * K, u)
    for run, u_r, v_r in _run_views(u, v, runs, groups):
        cols = _mixing_input(u_r, out=workspace.get(
            'cols', (groups, run.n + 1, run.windows, per_group), u))
        mixed = workspace.get('mixed', (groups, run.n, run.windows * per_group),
                              u)
        torch.bmm(_matching_dtype(mixing(run.key), cols),
                  cols.view(groups, run.n + 1, -1), out=mixed)
        v_r.mul_(_token_order(mixed, run, per_group))
    return v
