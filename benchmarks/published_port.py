"""A PosMLP run the way the published code runs it: the benchmark's
speed baseline for the token mixing."""
from __future__ import annotations

import functools
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn


class PublishedPort(nn.Module):
    """A PosMLP run the way the published code runs it (speed baseline).

    Uses the parameters of ``model`` (shared, not copied) but none of its
    stem, window or mixing code. Per level, the whole map is cut into w x w
    windows once (a map that windows do not tile is zero-padded to whole
    windows, without masking: fine for timing, not for accuracy, and
    cropped at the end of the level). In every block:

        u, v = GELU(proj_c_e(norm(x))).chunk(2)
        u (b, w, n, v*s) -> (b, w, n, v, s)
        posmap (1, m, n, s) = softmax over n of the encoding's scores,
                              recomputed every forward as published
        out = einsum('wmns,bwnvs->bwmvs', posmap, u) + bias  -> (b, w, n, C)
        x = x + proj_c_s(out * v)

    Tiny softmax weights are not zeroed: the published code keeps them,
    including the subnormal ones.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    @staticmethod
    def posmap(pos) -> torch.Tensor:
        """(1, m, n, s) mixing weights of a whole window, from the published
        formulas and the encoding's parameters alone (none of the model's
        offsets, indices or score code, so that an error there shows up as a
        difference from the port)."""
        window = tuple(pos.window)
        if hasattr(pos, 'attention_centers'):  # GQPE
            feats = published_gqpe_offsets(window, pos.generalized,
                                           pos.attention_centers.device)
            coefficients = published_gqpe_coefficients(pos)
            scores = torch.einsum('mnf,sf->mns',
                                  feats.to(coefficients.dtype), coefficients)
            return scores.unsqueeze(0).softmax(dim=-2)
        if hasattr(pos, 'window_relative_position_bias_table'):  # LRPE
            table = pos.window_relative_position_bias_table
            index = published_lrpe_index(window, table.device)
            n = index.shape[0]
            return table[index.reshape(-1)].view(1, n, n, -1)
        raise TypeError(f'no published computation for {type(pos).__name__}')

    @staticmethod
    def block(block, win: torch.Tensor) -> torch.Tensor:
        """One block on windows (b, w, n, C)."""
        gate = block.gate_unit
        if not hasattr(gate, 'pos') or not getattr(gate, 'pos_only', True):
            raise TypeError('the published port covers PoSGU gates with '
                            'pos_only=True')
        pos = gate.pos
        b, nw, n, _ = win.shape
        hidden = block.act(block.proj_c_e(block.norm(win)))
        u, v = hidden.chunk(2, dim=-1)
        groups = pos.groups
        u5 = u.reshape(b, nw, n, -1, groups)
        mixed = torch.einsum('wmns,bwnvs->bwmvs', PublishedPort.posmap(pos),
                             u5)
        mixed = mixed + pos.token_proj_n_bias.view(1, 1, n, 1, 1)
        out = block.proj_c_s(mixed.reshape(b, nw, n, -1) * v)
        if block.training and block.drop_path > 0:
            keep = 1.0 - block.drop_path
            out = out * win.new_empty(b, 1, 1, 1).bernoulli_(keep).div_(keep)
        return win + out

    def level(self, level, x: torch.Tensor) -> torch.Tensor:
        """NCHW in, channels-last (B, H, W, C) out."""
        if getattr(level, 'shift', False):
            raise TypeError('the published port covers unshifted windows '
                            'only (shift=False, as published)')
        x = x.permute(0, 2, 3, 1)
        if hasattr(level, 'pool'):
            x = level.pool(x)
        B, H, W, C = x.shape
        wh, ww = level.window
        Hp, Wp = -(-H // wh) * wh, -(-W // ww) * ww
        if (Hp, Wp) != (H, W):
            x = F.pad(x, (0, 0, 0, Wp - W, 0, Hp - H))
        win = x.reshape(B, Hp // wh, wh, Wp // ww, ww, C).permute(
            0, 1, 3, 2, 4, 5).reshape(B, -1, wh * ww, C)
        for block in level.encoder:
            win = self.block(block, win)
        x = win.reshape(B, Hp // wh, Wp // ww, wh, ww, C).permute(
            0, 1, 3, 2, 4, 5).reshape(B, Hp, Wp, C)
        return x[:, :H, :W]

    @staticmethod
    def stem(stem, x: torch.Tensor) -> torch.Tensor:
        """The published stem: conv -> BN -> GELU twice, then conv -> BN,
        on NCHW maps, out of place (not the model's own inference path)."""
        for i, (proj, norm) in enumerate(zip(stem.projs, stem.norms)):
            x = norm(proj(x))
            if i < 2:
                x = stem.act(x)
        return x

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        m = self.model
        x = self.stem(m.patch_embed, x)
        if getattr(m, 'absolute_pos_embed', None) is not None:
            x = x + m.position_embedding(x.shape[-2:]).permute(0, 3, 1, 2)
        maps = []
        for level in m.levels:
            y = self.level(level, x)
            maps.append(y)
            x = y.permute(0, 3, 1, 2)
        outs = []
        for i in m.out_indices:
            y = maps[i]
            if m.out_norm:
                y = getattr(m, f'norm{i}')(y)
            outs.append(y.permute(0, 3, 1, 2).contiguous())
        return tuple(outs)


# ---------------------------------------- the published positional formulas
def _window_grid(window, device):
    """Row and column of every token m = y * ww + x of a window."""
    wh, ww = window
    m = torch.arange(wh * ww, device=device)
    return m // ww, m % ww


@functools.lru_cache(maxsize=64)
def published_gqpe_offsets(window, generalized: bool, device
                           ) -> torch.Tensor:
    """(N, N, features) offset features of query m and key n, as published:
    dx = xn - xm, dy = ym - yn; (dx, dy, dx^2, dy^2, dx dy), or
    (dx, dy, dx^2 + dy^2) for the isotropic GQPE. A buffer in the published
    model: computed once per window."""
    ys, xs = _window_grid(window, device)
    dx = (xs[None, :] - xs[:, None]).float()
    dy = (ys[:, None] - ys[None, :]).float()
    if generalized:
        return torch.stack([dx, dy, dx * dx, dy * dy, dx * dy], dim=-1)
    return torch.stack([dx, dy, dx * dx + dy * dy], dim=-1)


def published_gqpe_coefficients(pos) -> torch.Tensor:
    """(groups, features): score = features . coefficients, recomputed from
    the centres (d1, d2) and spreads every forward. Generalized: S = A A^T
    (A itself when not symmetric), a, b, c, d = S00, S01, S11, S10, and

        score = (a d1 + b d2) dx + (c d2 + d d1) dy
                - (a dx^2 + c dy^2 + (b + d) dx dy) / 2

    isotropic (a scalar spread sigma per group):
    score = sigma^2 (d1 dx + d2 dy) - (dx^2 + dy^2) / 2."""
    centres = pos.attention_centers
    d1, d2 = centres[:, 0], centres[:, 1]
    spreads = pos.attention_spreads
    if not pos.generalized:
        sigma2 = spreads * spreads
        return torch.stack([sigma2 * d1, sigma2 * d2,
                            torch.full_like(d1, -0.5)], dim=-1)
    S = spreads @ spreads.transpose(1, 2) if pos.symmetric else spreads
    a, b, c, d = S[:, 0, 0], S[:, 0, 1], S[:, 1, 1], S[:, 1, 0]
    return torch.stack([a * d1 + b * d2, c * d2 + d * d1, -0.5 * a,
                        -0.5 * c, -0.5 * (b + d)], dim=-1)


@functools.lru_cache(maxsize=64)
def published_lrpe_index(window, device) -> torch.Tensor:
    """(N, N) row of query m and key n in the relative table, as published:
    (ym - yn + wh - 1) * (2 ww - 1) + (xm - xn + ww - 1)."""
    wh, ww = window
    ys, xs = _window_grid(window, device)
    return ((ys[:, None] - ys[None, :] + wh - 1) * (2 * ww - 1)
            + (xs[:, None] - xs[None, :] + ww - 1))


def port_check(model: nn.Module, port: PublishedPort, x: torch.Tensor
               ) -> dict:
    """Largest difference of the published port's outputs from PosMLP's."""
    model.eval()
    with torch.no_grad():
        ref, got = model(x), port(x)
    diff = max(float((a - b).abs().max()) for a, b in zip(ref, got))
    scale = max(float(a.abs().max()) for a in ref)
    return dict(size=list(x.shape[-2:]), max_abs_diff=diff,
                max_abs_output=scale, ok=diff <= 1e-4 * max(1.0, scale))
