"""The gate's token mixing: every window of a level in one batched matmul.

A gate gives, per block, mixing weights P (groups, N, N) over the N tokens
of a whole window and a per-query bias (N,). The published gate output is

    g[m, k] = (sum_n P_{k % groups}[m, n] u[n, k] + bias[m]) * v[m, k]

for the halves u, v of the block's activated hidden channels, within each
window. Here u is laid out window by window (windows.WindowGrid.to_windows:
zero at padded tokens), so one ``bmm`` per block mixes all windows:

    mixed = u_windows @ P^T                      (groups, rows, N)
    g     = (scale * mixed + bias) * v           back in map order

``scale`` makes partial windows exact for gates whose rows are a softmax
over the window's keys (``GateUnit.normalizes_over_keys``): a padded key is
zero, so it adds nothing to ``mixed``, and each row is renormalized over the
real keys of its window by the factor ``key_scale`` computes. Gates whose
weights are not normalized (LRPE, SGU) need no factor.

The weights of all blocks of a level are computed together, in one stacked
call per level (``level_mixings``; a captured graph stacks less, as it says
why): they depend on the gates' parameters and on the window only, never
on the input.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from .forward_mode import ForwardMode
from .windows import WindowGrid


@dataclass
class Mixing:
    """One block's mixing operands on one window grid. ``bias`` and
    ``scale`` are per token of one sample's map, in map order (H * W of
    them), so that applying them broadcasts over channels and samples
    only."""
    weights: torch.Tensor              # (groups, N, N)
    bias: torch.Tensor                 # (H * W,)
    scale: Optional[torch.Tensor]      # (groups, H * W), or None

    @property
    def groups(self) -> int:
        return self.weights.shape[0]


def real_key_sums(weights: torch.Tensor, key_mask: torch.Tensor
                  ) -> torch.Tensor:
    """(..., groups, windows * N): each query's weights summed over the
    real keys of its window, for weights (..., groups, N, N) over a whole
    window and ``key_mask`` (windows * N,) of a window layout. A real
    query's key scale is 1 / its sum (``key_scale``): its own key (offset
    0) always has weight, so the sum is never 0; a padded query's may be,
    and is never used."""
    n = weights.shape[-1]
    lead = weights.shape[:-2]
    flat = weights.reshape(-1, n, n)
    # the mask's windows as the rows of one matmul per (block, group). (In
    # twice: a tensor whose rows are a bare window count would make the
    # tracer guard on whether the count is 1; the copy's rows are ignored.)
    twice = torch.cat([key_mask, key_mask]).view(1, -1, n)
    sums = torch.bmm(twice.expand(flat.shape[0], -1, -1),
                     flat.transpose(1, 2))
    sums = sums.view(flat.shape[0], -1)[:, :key_mask.shape[0]]
    return sums.reshape(*lead, -1)


def key_scale(weights: torch.Tensor, key_mask: torch.Tensor,
              queries: torch.Tensor) -> torch.Tensor:
    """(..., groups, Q): the key scale of the Q real queries at positions
    ``queries`` (Q,) of the window layout: 1 / (the sum of each one's
    weights over its window's real keys, ``real_key_sums``). Taken at the
    real queries alone, so that no padded query's sum is ever divided by
    (nor, in a captured graph, a real query's position tested)."""
    return real_key_sums(weights, key_mask).index_select(
        -1, queries).reciprocal()


def level_mixings(gates: Sequence, grids: Sequence[WindowGrid],
                  mode: ForwardMode) -> List[Mixing]:
    """The mixing operands of a level's blocks: gate ``gates[j]`` on grid
    ``grids[j % len(grids)]`` (one grid per gate, or one per block parity),
    for a forward in ``mode`` (forward_mode.py). In float32 whatever
    autocast says (softmax scores need its range).

    The gates' weights are computed in one stacked call, which takes the
    fewest operations, except in a captured graph that records no
    backward: there each gate computes its own, which a compiler fuses into
    two kernels per block, where stacking the parameters costs a copy of
    each, per block (inductor lowers a concatenation of many tensors, or
    of any on a CPU, as one copy per input). In training the stack stays:
    each block's own weights would each add their backward's reductions.
    (The biases: ``mixings_on_grids``.)"""
    device = next(gates[0].parameters()).device
    with torch.autocast(device.type, enabled=False):
        kind = type(gates[0])
        each_own = mode.graph and not mode.autograd
        if all(type(g) is kind for g in gates) and not each_own:
            weights, bias = kind.stacked_weights(gates, mode.graph)
        else:  # (mixed gate types compute their own too)
            parts = [type(g).stacked_weights([g], mode.graph) for g in gates]
            weights = torch.cat([w for w, _ in parts])
            bias = [b[0] for _, b in parts]  # (one gate's, in either form)
        return mixings_on_grids(
            weights, bias, [g.normalizes_over_keys for g in gates],
            [grids[j % len(grids)] for j in range(len(gates))])


def mixings_on_grids(weights: torch.Tensor, bias,
                     normalized: Sequence[bool],
                     grids: Sequence[WindowGrid]) -> List[Mixing]:
    """Block j's mixing operands on grid ``grids[j]``, from its weights
    ``weights[j]`` (groups, N, N) and per-query bias ``bias[j]`` (N,) over
    a whole window: the bias laid out on the map, and where
    ``normalized[j]`` (rows a softmax over the window's keys) the key
    scale of partial windows.

    ``bias`` is stacked (D, N), laid out for all blocks at once (eager: one
    operation), or the list of the blocks' own (N,), each laid out by
    itself (a captured graph): a compiler fuses that gather into the
    kernel that adds the bias, and its backward is a scatter per block,
    where a stack costs a copy per block, and its backward (a stack of the
    blocks' gradients) another."""
    # (blocks are taken apart with unbind, and regrouped with stack:
    # their backwards gather the blocks' gradients once, where indexing
    # would add each block's gradient into a zero tensor of the stack)
    blocks = weights.unbind(0)
    device = weights.device
    biases: List[torch.Tensor] = [None] * len(grids)
    scales: List[Optional[torch.Tensor]] = [None] * len(grids)
    for grid in {id(g): g for g in grids}.values():
        chosen = [j for j, g in enumerate(grids) if g is grid]
        on_map = grid.map_index(device)
        index = grid.in_window_index_on_map(device)
        if isinstance(bias, torch.Tensor):
            rows = bias.index_select(1, index).unbind(0)
            for j in chosen:
                biases[j] = rows[j]
        else:
            for j in chosen:
                biases[j] = bias[j].index_select(0, index)
        normalized_here = [j for j in chosen if normalized[j]]
        if not normalized_here:
            continue
        stacked = weights if len(normalized_here) == len(grids) else \
            torch.stack([blocks[j] for j in normalized_here])
        on_tokens = key_scale(stacked, grid.key_mask(weights), on_map)
        for j, scale in zip(normalized_here, on_tokens.unbind(0)):
            scales[j] = scale
    return [Mixing(w, b, s) for w, b, s in zip(blocks, biases, scales)]


def mix(u: torch.Tensor, mixing: Mixing, grid: WindowGrid) -> torch.Tensor:
    """(K, B, H, W) channel-major u -> (groups, K/groups * B * windows, N):
    the weighted sums over each window's keys, before scale and bias."""
    windows = grid.to_windows(u, mixing.groups, slot='input')
    if windows.dtype == torch.float16 and mixing.scale is not None:
        # a partial window's weights on its real keys can be far below
        # float16's range, and the key scale far above it
        windows = windows.float()
    return torch.bmm(windows, mixing.weights.to(windows.dtype).transpose(1, 2))


def gate_output(mixed: torch.Tensor, mixing: Mixing, v: torch.Tensor
                ) -> torch.Tensor:
    """The gate's output (scale * m' + bias) * v in v's layout (K, B, H,
    W), from ``mixed`` = m', ``mix``'s result in map order
    (windows.WindowGrid.to_map: (K * B, H * W), channels grouped)."""
    K, B, H, W = v.shape
    groups = mixing.groups
    # m' with channel k = c * groups + g at [c, g]: v's order, as a view.
    # Every size spelled out: an inferred one is a quotient of symbolic
    # sizes under torch.compile, whose strides inductor cannot order. And
    # 5-D, (K/groups, groups, B, H, W): on a CPU, inductor lays out 4-D
    # tensors near a convolution channels-last (in a detector, the neck's),
    # and cannot order the strides that layout gives a view saved for the
    # backward (symbolic sizes; pytorch issues 185510 and 172204).
    m = mixed.view(groups, K // groups, B, H, W).transpose(0, 1)
    bias = mixing.bias.view(H, W)
    if mixing.scale is None:
        m = m + bias.to(mixed.dtype)
    else:
        # in the scale's dtype (float32 under autocast): a row whose real
        # keys hold little of its window's softmax has a scale beyond
        # float16's range
        m = torch.addcmul(bias, m, mixing.scale.view(1, groups, 1, H, W))
    # v first: the product takes v's (contiguous) layout
    return (v.reshape(K // groups, groups, B, H, W) * m).view(v.shape)


def gate_tokens(u: torch.Tensor, v: torch.Tensor, mixing: Mixing,
                grid: WindowGrid) -> torch.Tensor:
    """``gate_output`` of ``mix`` for token-major halves u, v (B, H, W, K),
    as a block that calls its modules has them; (B, H, W, K) out."""
    u, v = u.permute(3, 0, 1, 2), v.permute(3, 0, 1, 2)
    mixed = grid.to_map(mix(u, mixing, grid))
    return gate_output(mixed, mixing, v).permute(1, 2, 3, 0)
