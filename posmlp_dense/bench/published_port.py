"""A PosMLP run the way the published code runs it: the benchmark's
speed baseline for the token mixing."""
from __future__ import annotations

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
        """(1, m, n, s) mixing weights of a whole window."""
        if hasattr(pos, 'score_coefficients'):  # GQPE
            scores = torch.einsum('mnf,sf->mns', pos.rel_indices,
                                  pos.score_coefficients())
            return scores.unsqueeze(0).softmax(dim=-2)
        if hasattr(pos, 'window_relative_position_bias_table'):  # LRPE
            index = pos.window_relative_position_index
            n = index.shape[0]
            table = pos.window_relative_position_bias_table
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
        x = level.pool(x) if hasattr(level, 'pool') else x.permute(0, 2, 3, 1)
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
            x = x + m.position_embedding(x.shape[-2:])
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
