"""The lean training Function of a PosMLP block.

Its forward is ``block_pass`` (block_pass.py). Autograd through those
operations one by one keeps, per token of a block with C channels and K gate
channels, LayerNorm's input and output (2C), the pre-activation and the
activation (4K), u cut into windows, the mixed values and the gated product
(3K): 2C + 7K values, 16C at the published mlp_ratio of 4. This Function
keeps C + 3K, 7C (m' in map order: no windows' padding), and recomputes the rest
in its backward with elementwise passes; no matmul over tokens runs twice.

Notation, as in block_pass (per token; ``_w`` marks the window layout of
windows.WindowGrid.to_windows, P a group's weights):

    n = LN(x)            h = W_e n + b_e       (u, v) = GELU(h)
    m' = u_w P^T         m = to_map(scale * m' + bias)
    g = m * v            y = x + s * (W_s g + b_s)   (s: stochastic depth)

| tensor            | kept by the forward | in the backward                |
|-------------------|---------------------|--------------------------------|
| x                 | yes                 |                                |
| n, mean, rstd     |                     | recomputed from x              |
| h                 | yes                 |                                |
| u, v              |                     | recomputed: GELU(h)            |
| u_w               |                     | recomputed: to_windows(u)      |
| m'                | yes, in map order   |                                |
| m, g              |                     | recomputed from m', v          |
| P, scale, bias    | yes (per block)     |                                |

The backward, from dy:

    d_out = s * dy
    d_b_s = sum_t d_out        d_W_s = d_out^T g       d_g = d_out W_s
    d_v = d_g * m              d_m = d_g * v
    d_bias  = sum of d_m over channels and samples, per position
    d_scale = sum of d_m * m' over a group's channels and the samples,
              per position
    d_m'_w = to_windows(scale * d_m)       (zero at padded queries)
    d_P = d_m'_w^T u_w         d_u = to_map(d_m'_w P)
    d_h = GELU'(h) * (d_u, d_v)
    d_b_e = sum_t d_h          d_W_e = d_h n^T         d_n = d_h^T W_e
    d_x = dy + LN's backward of d_n

The gradients of P, scale and bias flow on into the gates' parameters
through autograd (token_mixing.level_mixings), so no gate formula is
differentiated by hand.

Under autocast the forward is block_pass as autocast runs it (LayerNorm in
float32, matmuls and GELU in the autocast dtype); the backward computes in
the dtype of h and returns each gradient in its input's dtype.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .block_pass import BlockWeights, block_pass
from .token_mixing import Mixing
from .windows import WindowGrid


def lean_block(x: torch.Tensor, w: BlockWeights, mixing: Mixing,
               grid: WindowGrid, drop_scale: Optional[torch.Tensor] = None
               ) -> torch.Tensor:
    """``block_pass(x, w, mixing, grid, drop_scale).output``, through the
    lean Function."""
    return LeanBlock.apply(x, w.norm_weight, w.norm_bias, w.expand_weight,
                           w.expand_bias, w.shrink_weight, w.shrink_bias,
                           mixing.weights, mixing.bias, mixing.scale,
                           drop_scale, grid, w.eps, w.approximate)


class _Inputs(NamedTuple):
    """LeanBlock's inputs, by name: ``ctx.needs_input_grad`` read as one
    of these says which gradients autograd asks for."""
    x: bool
    norm_weight: bool
    norm_bias: bool
    expand_weight: bool
    expand_bias: bool
    shrink_weight: bool
    shrink_bias: bool
    weights: bool
    bias: bool
    scale: bool
    drop_scale: bool
    grid: bool
    eps: bool
    approximate: bool


class _Saved(NamedTuple):
    x: torch.Tensor
    norm_weight: torch.Tensor
    norm_bias: torch.Tensor
    expand_weight: torch.Tensor
    shrink_weight: torch.Tensor
    hidden: torch.Tensor                 # h, (2K, T)
    mixed: torch.Tensor                  # m' in map order, (K * B, H * W)
    weights: torch.Tensor                # P, (groups, N, N)
    bias: torch.Tensor
    scale: Optional[torch.Tensor]
    drop_scale: Optional[torch.Tensor]


class LeanBlock(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, expand_weight, expand_bias,
                shrink_weight, shrink_bias, weights, bias, scale, drop_scale,
                grid, eps, approximate):
        w = BlockWeights(norm_weight, norm_bias, expand_weight, expand_bias,
                         shrink_weight, shrink_bias, eps, approximate)
        result = block_pass(x, w, Mixing(weights, bias, scale), grid,
                            drop_scale, keep_intermediates=True)
        ctx.grid, ctx.eps, ctx.approximate = grid, eps, approximate
        # the level's first block on this grid runs the last backward on it
        ctx.releases_layouts = grid.claim_release()
        # the dtype LayerNorm ran in (float32 under autocast)
        ctx.norm_dtype = torch.promote_types(x.dtype, torch.float32) \
            if torch.is_autocast_enabled(x.device.type) else x.dtype
        ctx.save_for_backward(*_Saved(
            x, norm_weight, norm_bias, expand_weight, shrink_weight,
            result.hidden, result.mixed, weights, bias, scale, drop_scale))
        return result.output

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        s = _Saved(*ctx.saved_tensors)
        needs = _Inputs(*ctx.needs_input_grad)
        grid: WindowGrid = ctx.grid
        B, H, W, C = s.x.shape
        dtype = s.hidden.dtype
        K = s.hidden.shape[0] // 2
        groups = s.weights.shape[0]
        with torch.autocast(dy.device.type, enabled=False):
            d_out = dy.reshape(B, -1).to(dtype)
            # stochastic depth's scale: eager PyTorch scales d_out (one
            # multiply); a captured graph scales what d_out meets (g, d_g
            # and d_out's sum), which a compiler computes in the kernels
            # that read them instead of writing a scaled copy of dy
            sample_scale = None
            if s.drop_scale is not None:
                if grid.gathers:
                    sample_scale = s.drop_scale.to(dtype).view(1, 1, B, 1, 1)
                else:
                    d_out = d_out * s.drop_scale.to(dtype).unsqueeze(1)
            d_out = d_out.view(-1, C)
            # (indexed, not unbind: torch.compile merges this GELU with
            # the forward's, and an unbind in the backward would make its
            # partitioner save the activations instead of recomputing them)
            act = F.gelu(s.hidden, approximate=ctx.approximate).view(
                2, K, B, H, W)
            u, v = act[0], act[1]
            # as (K / groups, groups, B, H, W), channel k = c * groups + g
            # at [c, g]: v as it is, m' (grouped) as a view; 5-D, as the
            # forward lays them out (token_mixing.gate_output says why)
            v = v.reshape(K // groups, groups, B, H, W)
            mixed = s.mixed.view(groups, K // groups, B, H, W).transpose(
                0, 1)
            bias = s.bias.view(H, W)
            # m = scale * m' + bias; with a key scale in its own dtype
            # (float32: it may exceed float16's range), as the forward does
            if s.scale is None:
                m = mixed + bias.to(dtype)
            else:
                scale = s.scale.view(1, groups, 1, H, W)
                m = torch.addcmul(bias.to(scale.dtype), mixed, scale)
            g = (v * m).to(dtype)
            d_g = s.shrink_weight.to(dtype).t().mm(d_out.t()).view_as(v)
            if sample_scale is not None:
                g, d_g = g * sample_scale, d_g * sample_scale
            g = g.view(K, -1)
            d_shrink_w = d_out.t().mm(g.t()) if needs.shrink_weight else None
            d_shrink_b = None
            if needs.shrink_bias:
                d_shrink_b = d_out.sum(0) if sample_scale is None else \
                    (d_out.view(B, -1, C) * sample_scale.view(B, 1, 1)).sum(
                        (0, 1))
            # d(u, v) for GELU's backward, as one (2, K, T) tensor in eager
            # PyTorch, whose halves are written in place
            d_act = _activation_gradient_buffer(grid, v, dtype)
            d_v = torch.mul(d_g, m, out=None if d_act is None else d_act[1])
            d_m = d_g * v
            # bias and scale are shared by a group's channels and the
            # samples: their gradients are sums, per token of the map
            d_bias = d_m.sum((0, 1, 2)).flatten() if needs.bias else None
            d_scale = None
            if s.scale is not None:
                if needs.scale:
                    d_scale = (d_m * mixed).sum((0, 2)).flatten(1)
                d_m = d_m * scale
            d_m_w = grid.to_windows(d_m.view(K, B, H, W), groups,
                                    slot='gradient')
            weights = s.weights.to(d_m_w.dtype)
            d_weights = None
            if needs.weights:
                u_w = grid.to_windows(u, groups, slot='input').to(
                    d_m_w.dtype)
                d_weights = torch.bmm(d_m_w.transpose(1, 2), u_w)
            d_u_w = torch.bmm(d_m_w, weights)
            if ctx.releases_layouts:
                grid.release_layouts()
            d_hidden = _hidden_gradient(grid, d_u_w, d_v, d_act, s.hidden,
                                        ctx.approximate, dtype)
            d_expand_b = d_hidden.sum(1) if needs.expand_bias else None
            ln_input = s.x.reshape(-1, C).to(ctx.norm_dtype)
            normed, mean, rstd = torch.native_layer_norm(
                ln_input, (C,), s.norm_weight, s.norm_bias, ctx.eps)
            d_expand_w = d_hidden.mm(normed.to(dtype)) \
                if needs.expand_weight else None
            d_normed = d_hidden.t().mm(s.expand_weight.to(dtype))
            d_ln, d_norm_w, d_norm_b = \
                torch.ops.aten.native_layer_norm_backward(
                    d_normed.to(ctx.norm_dtype), ln_input, (C,), mean, rstd,
                    s.norm_weight, s.norm_bias,
                    [needs.x, needs.norm_weight, needs.norm_bias])
            d_x = dy + d_ln.view_as(dy).to(dy.dtype) if needs.x else None
        return (d_x, d_norm_w, d_norm_b,
                _like(d_expand_w, s.expand_weight),
                _like(d_expand_b, s.expand_weight),
                _like(d_shrink_w, s.shrink_weight),
                _like(d_shrink_b, s.shrink_weight),
                _like(d_weights, s.weights), _like(d_bias, s.bias),
                _like(d_scale, s.scale), None, None, None, None)


def _activation_gradient_buffer(grid: WindowGrid, v: torch.Tensor,
                                dtype: torch.dtype) -> Optional[torch.Tensor]:
    """An empty (2, K/groups, groups, B, H, W) tensor of ``dtype`` for d(u)
    and d(v), v's layout, in eager PyTorch; None in a captured graph, where
    they are joined by cat instead (a copy into a view makes
    torch.compile's functionalization guard on the map's size, and compile
    again at every new size)."""
    if grid.gathers:
        return None
    return v.new_empty((2, *v.shape), dtype=dtype)


def _hidden_gradient(grid: WindowGrid, d_u_w: torch.Tensor,
                     d_v: torch.Tensor, d_act: Optional[torch.Tensor],
                     hidden: torch.Tensor, approximate: str,
                     dtype: torch.dtype) -> torch.Tensor:
    """d(h), (2K, T) of ``dtype``: GELU's backward of d(u, v), from d(u) in
    the window layout (groups, K/groups * B * windows, N) and d(v)
    (K/groups, groups, B, H, W), channels in order. In eager PyTorch
    ``d_act`` (``_activation_gradient_buffer``) holds d(v) in its second
    half already, d(u) is gathered into its first straight from the
    window layout, and one GELU backward runs on the whole. In a captured
    graph each half's GELU backward comes first and cat joins the
    results: a compiler then computes each half in the kernel that
    gathers or multiplies it and writes it into its slice, with no d(u, v)
    written and read again."""
    V, groups, B, H, W = d_v.shape
    if d_act is None:
        d_u = grid.to_map(d_u_w).view(groups, V, B, H, W).transpose(0, 1)
        h = hidden.view(2, V, groups, B, H, W)
        return torch.cat([
            torch.ops.aten.gelu_backward(d_u.to(dtype), h[0],
                                         approximate=approximate),
            torch.ops.aten.gelu_backward(d_v.to(dtype), h[1],
                                         approximate=approximate)
        ]).view(2 * V * groups, -1)
    into = d_act[0].transpose(0, 1).flatten(3)      # (groups, V, B, H * W)
    rows = d_u_w.view(groups, V, B, -1)
    if rows.dtype == dtype:
        torch.index_select(rows, 3, grid.map_index(rows.device), out=into)
    else:
        into.copy_(rows.index_select(3, grid.map_index(rows.device)))
    return torch.ops.aten.gelu_backward(
        d_act.view(2 * V * groups, -1), hidden, approximate=approximate)


def _like(grad: Optional[torch.Tensor], ref: Optional[torch.Tensor]):
    """A gradient in its input's dtype (None passes)."""
    if grad is None or ref is None:
        return grad
    return grad.to(ref.dtype)
