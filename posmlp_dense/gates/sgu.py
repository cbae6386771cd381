"""SGU: the spatial gating unit of gMLP, the baseline PoSGU replaces.

u is layer-normalized, mixed over the tokens of a window by a learned N x N
matrix plus a per-query bias (a Linear over tokens), and multiplied with v.
Its parameters grow with N^2 and are tied to the window size. Kept for
ablations; state-dict names follow the published code (``norm_list.0``,
``proj_list.0``).
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
from torch import nn

from ..windows import WindowGrid
from .base import GateUnit


class SGU(GateUnit):

    def __init__(self, channels: int, window: Tuple[int, int],
                 norm_eps: float = 1e-6):
        super().__init__(window, groups=1)
        self.channels = channels
        n = self.num_positions
        self.norm_list = nn.Sequential(nn.LayerNorm(channels, eps=norm_eps))
        self.proj_list = nn.Sequential(nn.Linear(n, n))
        self.reset_parameters()
        self.register_load_state_dict_pre_hook(_check_window)

    def reset_parameters(self):
        # gMLP's initialization: near-zero weights and a bias of one, so the
        # gate starts as (almost) the identity on v.
        nn.init.normal_(self.proj_list[0].weight, std=1e-6)
        nn.init.ones_(self.proj_list[0].bias)
        self.norm_list[0].reset_parameters()

    # its LayerNorm acts on u before the mixing: autograd, not the lean
    # training Function, differentiates it
    lean_backward = False

    @classmethod
    def stacked_weights(cls, gates: Sequence['SGU'], captured: bool = False):
        projs = [g.proj_list[0] for g in gates]
        biases = [p.bias for p in projs]
        return (torch.stack([p.weight for p in projs]).unsqueeze(1),
                biases if captured else torch.stack(biases))

    def prepare_input(self, u: torch.Tensor) -> torch.Tensor:
        """LayerNorm over the channels of channel-major u (K, B, H, W)."""
        tokens = u.view(u.shape[0], -1).t()           # (B * H * W, K)
        return self.norm_list[0](tokens).t().contiguous().view(u.shape)

    def forward(self, u: torch.Tensor, v: torch.Tensor, grid: WindowGrid
                ) -> torch.Tensor:
        """(proj over each window's tokens of LayerNorm(u)) * v, on
        token-major u, v (B, H, W, K). The projection's bias lands on every
        query, padded ones too; those are dropped on the way back."""
        B, H, W, K = u.shape
        u = self.norm_list(u).permute(3, 0, 1, 2)
        mixed = grid.to_map(self.proj_list(grid.to_windows(u, 1)))
        return v * mixed.view(K, B, H, W).permute(1, 2, 3, 0)

    def _fast_path_modules(self):
        # the fast path computes these two from their weights
        return super()._fast_path_modules() + [
            (self.norm_list[0], nn.LayerNorm), (self.proj_list[0], nn.Linear)]

    def extra_repr(self) -> str:
        return f'channels={self.channels}, window={self.window}'


def _check_window(module, state_dict, prefix, *args):
    key = prefix + 'proj_list.0.weight'
    value = state_dict.get(key)
    expected = (module.num_positions, module.num_positions)
    if value is not None and tuple(value.shape) != expected:
        raise ValueError(
            f'{key} has shape {tuple(value.shape)} but this SGU gate has a '
            f'{module.window[0]}x{module.window[1]} window ({expected}): SGU '
            f'weights are tied to the window they were trained with and '
            f'cannot be resized; build the model with that window')
