"""Straightforward reference computations, written for clarity, not speed.

* ``published_forward_levels``: the published model's computation as its
  code does it (map cut into w x w windows, 5-D re-arrangement, einsum
  mixing). Valid only where windows tile every level.
* ``per_window_forward_levels``: any input size; every window's *real*
  tokens are processed alone (no padding, no masks), with mixing weights
  computed from the published formulas below for exactly those tokens.
* ``padded_masked_level``: pad to whole windows, mask the padded keys.

They read the parameters of a posmlp_dense model and call its per-token
modules (stem convolutions and norms, LayerNorm, Linear), but none of its
window, position-encoding or mixing code, so they check that code
independently.

The published formulas (PosMLP, "Parameterization of Cross-Token Relations
with Relative Positional Encoding for Vision MLP", ACM MM 2022, and the
authors' released code). A window holds N = wh * ww tokens, token
m = ym * ww + xm; the gate's u has K channels in gamma groups, channel k in
group k % gamma:

    PosMap(u)[m, k] = sum_n P_{k % gamma}[m, n] u[n, k] + bias[m]
    gate output     = PosMap(u) * v          (u, v = hidden.chunk(2))

GQPE, offsets dx = xn - xm, dy = ym - yn (mind the signs), per group a
centre (d1, d2) and a spread A, S = A A^T (or A itself when not symmetric),
a, b, c, d = S00, S01, S11, S10:

    score = (a d1 + b d2) dx + (c d2 + d d1) dy
            - (a dx^2 + c dy^2 + (b + d) dx dy) / 2
    isotropic (scalar spread sigma): score = sigma^2 (d1 dx + d2 dy)
                                             - (dx^2 + dy^2) / 2
    P[m, :] = softmax over the keys n of score[m, :]

LRPE: P[m, n] = table[(ym - yn + wh - 1) (2 ww - 1) + (xm - xn + ww - 1)],
no softmax. SGU (gMLP): u -> LayerNorm -> Linear over the window's tokens.
The absolute position embedding (1, gh * gw, C) is reshaped to
(1, C, gh, gw) as it is stored (a plain reshape, no transpose) and resized
bicubically (align_corners=False) to the stem's output map.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from posmlp_dense.gates import GQPE, LRPE, SGU


# ------------------------------------------------- per-token modules
def stem_reference(stem, x):
    """NCHW image -> NCHW stride-4 map: (conv -> BN -> GELU) twice, then
    conv -> BN (the stem's own conv and BatchNorm layers)."""
    for i in range(3):
        x = stem.norms[i](stem.projs[i](x))
        if i < 2:
            x = F.gelu(x)
    return x


def level_input(level, x_nchw):
    """NCHW map -> the level's (B, H, W, C) input: downsampled by the
    level's conv and LayerNorm when it has them, else only permuted."""
    if not hasattr(level, 'pool'):
        return x_nchw.permute(0, 2, 3, 1)
    return level.pool.norm(level.pool.conv(x_nchw).permute(0, 2, 3, 1))


# ------------------------------------------------------------ mixing weights
def gqpe_scores(pos: GQPE, ys: torch.Tensor, xs: torch.Tensor):
    """(groups, n, n) float64 scores among the tokens at (ys, xs)."""
    dx = (xs[None, :] - xs[:, None]).double()
    dy = (ys[:, None] - ys[None, :]).double()
    d1 = pos.attention_centers[:, 0].double()[:, None, None]
    d2 = pos.attention_centers[:, 1].double()[:, None, None]
    if pos.generalized:
        A = pos.attention_spreads.double()
        S = A @ A.transpose(1, 2) if pos.symmetric else A
        a, b = S[:, 0, 0, None, None], S[:, 0, 1, None, None]
        c, d = S[:, 1, 1, None, None], S[:, 1, 0, None, None]
        return ((a * d1 + b * d2) * dx + (c * d2 + d * d1) * dy
                - 0.5 * (a * dx ** 2 + c * dy ** 2 + (b + d) * dx * dy))
    sigma2 = pos.attention_spreads.double()[:, None, None] ** 2
    return sigma2 * (d1 * dx + d2 * dy) - 0.5 * (dx ** 2 + dy ** 2)


def gqpe_weights(pos: GQPE, ys: torch.Tensor, xs: torch.Tensor):
    """(groups, n, n) softmax weights among tokens at (ys, xs)."""
    return gqpe_scores(pos, ys, xs).softmax(dim=-1).float()


def lrpe_weights(pos: LRPE, ys: torch.Tensor, xs: torch.Tensor):
    wh, ww = pos.window
    index = ((ys[:, None] - ys[None, :] + wh - 1) * (2 * ww - 1)
             + (xs[:, None] - xs[None, :] + ww - 1))
    table = pos.window_relative_position_bias_table
    return table[index].permute(2, 0, 1)


def gate_reference(gate, u, v, ys, xs):
    window = gate.window
    m_full = ys * window[1] + xs
    if isinstance(gate, SGU):
        u = gate.norm_list[0](u)
        proj = gate.proj_list[0]
        mixed = proj.weight[m_full][:, m_full] @ u + proj.bias[m_full][:, None]
        return mixed * v
    pos = gate.pos
    weights = gqpe_weights(pos, ys, xs) if isinstance(pos, GQPE) \
        else lrpe_weights(pos, ys, xs)
    if not gate.pos_only:
        weights = weights + gate.token_proj_n_weight[0][m_full][:, m_full]
    groups = weights.shape[0]
    mixed = torch.empty_like(u)
    for s in range(groups):
        cols = torch.arange(s, u.shape[1], groups)  # channel k in group k % S
        mixed[:, cols] = weights[s] @ u[:, cols]
    mixed = mixed + pos.token_proj_n_bias.view(-1)[m_full][:, None]
    return mixed * v


def block_reference(block, tokens, ys, xs):
    hidden = F.gelu(block.proj_c_e(block.norm(tokens)))
    u, v = hidden.chunk(2, dim=-1)
    return tokens + block.proj_c_s(gate_reference(block.gate_unit, u, v, ys,
                                                  xs))


# ----------------------------------------------------- per-window reference
def absolute_position_embedding(model, size):
    """(1, C, H, W): the stored (1, gh * gw, C) embedding reshaped as it is
    stored, then resized bicubically to the map when the sizes differ."""
    grid = model.ape_grid
    embed = model.absolute_pos_embed.reshape(1, -1, grid[0], grid[1])
    if tuple(size) == tuple(grid):
        return embed
    return F.interpolate(embed, size=tuple(size), mode='bicubic',
                         align_corners=False)


def window_cuts(length, window, origin):
    """[(start, stop, in-window offset)] of the windows along one axis."""
    cuts, pos = [], 0
    if origin:
        cuts.append((0, min(origin, length), window - origin))
        pos = min(origin, length)
    while pos < length:
        cuts.append((pos, min(pos + window, length), 0))
        pos += window
    return cuts


def per_window_level(level, x_nchw):
    x = level_input(level, x_nchw)
    B, H, W, _ = x.shape
    wh, ww = level.window
    for j, block in enumerate(level.encoder):
        origin = (0, 0)
        if level.shift and j % 2 == 1:
            origin = (wh // 2 if H > wh else 0, ww // 2 if W > ww else 0)
        out = x.clone()
        for b in range(B):
            for r0, r1, oy in window_cuts(H, wh, origin[0]):
                for c0, c1, ox in window_cuts(W, ww, origin[1]):
                    ys, xs = torch.meshgrid(torch.arange(oy, oy + r1 - r0),
                                            torch.arange(ox, ox + c1 - c0),
                                            indexing='ij')
                    tokens = x[b, r0:r1, c0:c1].reshape(-1, x.shape[-1])
                    res = block_reference(block, tokens, ys.reshape(-1),
                                          xs.reshape(-1))
                    out[b, r0:r1, c0:c1] = res.view(r1 - r0, c1 - c0, -1)
        x = out
    return x


def per_window_forward_levels(model, x):
    """Every level's output (B, H, W, C), window by window, real tokens only."""
    x = stem_reference(model.patch_embed, x)
    if model.absolute_pos_embed is not None:
        x = x + absolute_position_embedding(model, x.shape[-2:])
    maps = []
    for level in model.levels:
        y = per_window_level(level, x)
        maps.append(y)
        x = y.permute(0, 3, 1, 2)
    return maps


# -------------------------------------------------- published computation
def published_forward_levels(model, x):
    """The published code path: partition, 5-D einsum, reverse."""
    x = stem_reference(model.patch_embed, x)
    maps = []
    for level in model.levels:
        x = level_input(level, x)
        B, H, W, C = x.shape
        w = level.window[0]
        assert H % w == 0 and W % w == 0, 'published code needs tiling'
        win = x.view(B, H // w, w, W // w, w, C).permute(0, 1, 3, 2, 4, 5)
        win = win.reshape(B, -1, w * w, C)
        for block in level.encoder:
            hidden = F.gelu(block.proj_c_e(block.norm(win)))
            u, v = hidden.chunk(2, dim=-1)
            pos = block.gate_unit.pos
            groups = pos.groups
            ys, xs = torch.meshgrid(torch.arange(w), torch.arange(w),
                                    indexing='ij')
            ys, xs = ys.reshape(-1), xs.reshape(-1)
            weights = gqpe_weights(pos, ys, xs) if isinstance(pos, GQPE) \
                else lrpe_weights(pos, ys, xs)
            posmap = weights.permute(1, 2, 0).unsqueeze(0)  # (1, m, n, s)
            u5 = u.reshape(*u.shape[:-1], -1, groups)       # b w n v s
            mixed = torch.einsum('wmns,bwnvs->bwmvs', posmap, u5)
            mixed = mixed + pos.token_proj_n_bias.view(1, 1, -1, 1, 1)
            gated = mixed.reshape(u.shape) * v
            win = win + block.proj_c_s(gated)
        x = win.view(B, H // w, W // w, w, w, C).permute(0, 1, 3, 2, 4, 5)
        x = x.reshape(B, H, W, C)
        maps.append(x)
        x = x.permute(0, 3, 1, 2)
    return maps


# ----------------------------------------- padding + masking, done plainly
def padded_masked_level(level, x_nchw, fill: float = 1e3):
    """Pad the map with garbage to whole windows and mask the padded keys.

    GQPE: padded keys get -inf before the softmax; LRPE: zero weight. Padded
    tokens are computed like any other and cropped at the end.
    """
    x = level_input(level, x_nchw)
    B, H, W, C = x.shape
    wh, ww = level.window
    Hp, Wp = -(-H // wh) * wh, -(-W // ww) * ww
    padded = fill * torch.randn(B, Hp, Wp, C)
    padded[:, :H, :W] = x
    real = torch.zeros(Hp, Wp, dtype=torch.bool)
    real[:H, :W] = True
    ys, xs = torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing='ij')
    ys, xs = ys.reshape(-1), xs.reshape(-1)
    for block in level.encoder:
        gate = block.gate_unit
        pos = gate.pos
        for b in range(B):
            for r in range(0, Hp, wh):
                for c in range(0, Wp, ww):
                    tokens = padded[b, r:r + wh, c:c + ww].reshape(-1, C)
                    key_real = real[r:r + wh, c:c + ww].reshape(-1)
                    hidden = F.gelu(block.proj_c_e(block.norm(tokens)))
                    u, v = hidden.chunk(2, dim=-1)
                    if isinstance(pos, GQPE):
                        score = gqpe_scores(pos, ys, xs)
                        score = score.masked_fill(~key_real, float('-inf'))
                        weights = score.softmax(-1).float()
                    else:
                        weights = lrpe_weights(pos, ys, xs)
                        weights = weights * key_real.float()
                    groups = weights.shape[0]
                    mixed = torch.empty_like(u)
                    for s in range(groups):
                        cols = torch.arange(s, u.shape[1], groups)
                        mixed[:, cols] = weights[s] @ u[:, cols]
                    mixed = mixed + pos.token_proj_n_bias.view(-1, 1)
                    out = tokens + block.proj_c_s(mixed * v)
                    padded[b, r:r + wh, c:c + ww] = out.view(wh, ww, C)
    return padded[:, :H, :W]
