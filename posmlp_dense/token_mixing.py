"""Apply per-group token-mixing matrices to window-partitioned tokens.

This is the hot loop of the model. For each run of windows of one class (see
windows.py) the gate provides P (groups, n, n) and a per-query bias (n,), and
the gated output is

    g[m, k] = (sum_n P[group(k)][m, n] * u[n, k] + bias[m]) * v[m, k]

The gate's channels arrive group-major (channel g * channels_per_group + p;
the block permutes its projections so, see GateUnit.group_major). The
hidden values come in one of three layouts:

* Channel-major (``mix_channel_major``; the lean training Function and
  INFERENCE mode): a run's u is stored transposed, channel after channel,
  each channel holding the run's windows one after another. A group's
  channels are then one (V * windows, n) matrix, and the mixing of the whole
  run is one batched matmul by P^T, with the bias added by the same call;
  the product with v multiplies contiguous values.
* Token-major (``mix_tokens``; autograd through each operation, the
  reference the lean path is tested against): the token buffer stores a run
  as (windows, n, channels). u is re-arranged into (groups, n + 1, windows *
  channels_per_group), with a row of ones that carries the bias as an extra
  column of P, and the product with v is written back in token order.
* Padded windows (``mix_padded_windows``; a captured graph): the padded
  keys are taken out of the mixing instead.

In INFERENCE mode (see forward_mode.py) the gated product is written over
v, and the scratch buffers are reused from run to run.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch

from .windows import PaddedWindows, WindowRun
from .workspace import Workspace

# key -> (groups, n, n + 1): the mixing matrices with the bias appended
AugmentedMixingFn = Callable[[Tuple[int, int, int, int]], torch.Tensor]


def mix_tokens(u: torch.Tensor, v: torch.Tensor, runs: Sequence[WindowRun],
               groups: int, mixing: AugmentedMixingFn) -> torch.Tensor:
    """Gated token mixing of a (T, K) buffer; returns a (T, K) tensor.

    ``u`` and ``v`` are (T, K) (they may be strided halves of one tensor)
    whose rows are the ``runs``, in order, and whose channels are
    group-major: channel k belongs to group ``k // (K // groups)``.
    """
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


def mix_channel_major(u: torch.Tensor, v: torch.Tensor, run: WindowRun,
                      groups: int, mixing: AugmentedMixingFn,
                      workspace: Workspace) -> torch.Tensor:
    """INFERENCE mode, one run: the gated product of channel-major halves
    u, v (K, run.rows), written over ``v`` and returned."""
    u_rows, v_rows = group_rows(u, groups, run), group_rows(v, groups, run)
    mixed = workspace.get('mixed', u_rows.shape, u)
    v_rows.mul_(mix_rows(u_rows, mixing(run.key), out=mixed))
    return v


def group_rows(block: torch.Tensor, groups: int, run: WindowRun
               ) -> torch.Tensor:
    """A run's channel-major (K, run.rows) block -> (groups, V * windows,
    n): each row one channel of one window."""
    return block.view(groups, -1, run.n)


def mix_rows(u: torch.Tensor, augmented: torch.Tensor,
             out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """u P^T + bias for channel-major u (groups, rows, n), whose rows are
    one channel of one window each; ``augmented`` (groups, n, n + 1) is P
    with the bias appended."""
    n = u.shape[-1]
    augmented = _matching_dtype(augmented, u)
    return torch.baddbmm(augmented[:1, :, n].unsqueeze(1), u,
                         augmented[..., :n].transpose(1, 2), out=out)


def mix_padded_windows(u: torch.Tensor, v: torch.Tensor,
                       windows: PaddedWindows, groups: int,
                       weights: torch.Tensor, bias: torch.Tensor,
                       normalize: bool) -> torch.Tensor:
    """Gated token mixing over padded full windows (a captured graph).

    ``weights`` (groups, n, n) and ``bias`` (n,) are the full window's. The
    padded keys are taken out: u is zeroed there, and with ``normalize``
    (GQPE) ``weights`` are unnormalized softmax numerators whose rows are
    divided by their sum over each window's real keys, which is the softmax
    over the real keys. Outputs at padded queries are garbage, cropped later.
    """
    T, K = u.size(0), u.size(1)
    n = windows.n
    per_group = K // groups
    mask = windows.token_mask.to(u.dtype)                       # (T, 1)
    # Channels-major layout (groups, per_group, T): every view below merges
    # or splits dimensions that are never a bare window count. (A tensor
    # with a dimension of "windows" makes the tracer guard that it is not 1,
    # which would refuse maps that fit one window.)
    # where, not a product: a padded token may hold inf/NaN (see below)
    real = _contiguous(torch.where(mask > 0, u, torch.zeros_like(u)).t())
    rows = real.view(groups, per_group, T)
    if normalize:
        # one more row per group carries the key mask: the same matmul then
        # sums each query's weights over its window's real keys
        rows = torch.cat([rows, mask.view(1, 1, T).expand(groups, 1, T)],
                         dim=1)
    width = rows.size(1)
    # (an unconditional cast: no branch on dtypes, which FX cannot trace)
    mixed = torch.bmm(rows.view(groups, -1, n),
                      weights.transpose(1, 2).to(rows.dtype))
    mixed = mixed.view(groups, width, T)
    if normalize:
        # A padded query far from every real key of its window can have all
        # of its weight on padded keys: a zero sum. Its output is cropped,
        # but a 0/0 there would be NaN, which reaches the next block's
        # padded tokens and, in training, the gradients (0 * inf). The floor
        # binds only for such queries: a real query's sum includes its own
        # weight exp(-shift) (GQPE.full_window_weights), far above the floor
        # unless its row's top score exceeds ~140.
        mixed = mixed[:, :per_group] / mixed[:, per_group:].clamp_min(
            torch.finfo(mixed.dtype).tiny)
    mixed = mixed.reshape(K, T) + bias.to(mixed.dtype)[
        windows.position_in_window]
    return v * mixed.t()


def _contiguous(x: torch.Tensor) -> torch.Tensor:
    return torch.clone(x, memory_format=torch.contiguous_format)


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
