"""PoSGU: the positional gating unit of PosMLP.

The block's hidden channels are split into halves u, v (``chunk(2)``); the
gate returns PosMap(u) * v, where PosMap mixes the tokens of each window with
the per-group weights of a positional encoding (GQPE or LRPE, at
``gate_unit.pos``) and adds a per-query bias. Channel k of u is in group
k % groups, as published.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
from torch import nn
from timm.layers import trunc_normal_

from ..token_mixing import gate_tokens, mixings_on_grids
from ..windows import WindowGrid
from .base import GateUnit
from .gqpe import GQPE
from .lrpe import LRPE


class PoSGU(GateUnit):

    def __init__(self, channels: int, window: Tuple[int, int], groups: int,
                 encoding: str = 'gqpe', pos_only: bool = True,
                 generalized: bool = True):
        super().__init__(window, groups)
        if channels % groups:
            raise ValueError(f'{groups} groups do not divide {channels} gate '
                             f'channels')
        self.channels = channels
        if encoding == 'gqpe':
            if not pos_only:
                raise ValueError('pos_only=False (an extra learned N x N '
                                 'token matrix) is defined for the LRPE gate '
                                 'only')
            self.pos = GQPE(window, groups, generalized=generalized)
        elif encoding == 'lrpe':
            self.pos = LRPE(window, groups)
        else:
            raise ValueError(f'unknown positional encoding {encoding!r}')
        self.normalizes_over_keys = self.pos.softmax
        self.pos_only = pos_only
        if not pos_only:
            # LRPE's "pos_only=False": a learned (1, N, N) matrix added to
            # every group's weights.
            self.token_proj_n_weight = nn.Parameter(
                torch.zeros(1, self.num_positions, self.num_positions))
            trunc_normal_(self.token_proj_n_weight, std=1e-6)
            self.register_load_state_dict_pre_hook(_check_token_matrix)

    @classmethod
    def stacked_weights(cls, gates: Sequence['PoSGU'],
                        captured: bool = False):
        encodings = [g.pos for g in gates]
        if any(type(p) is not type(encodings[0]) for p in encodings):
            raise ValueError('stacked_weights: the gates mix GQPE and LRPE '
                             'encodings')
        weights = type(encodings[0]).stacked_weights(encodings, captured)
        if not gates[0].pos_only:
            weights = weights + torch.stack(
                [g.token_proj_n_weight for g in gates])
        return weights, type(encodings[0]).stacked_bias(encodings, captured)

    def forward(self, u: torch.Tensor, v: torch.Tensor, grid: WindowGrid
                ) -> torch.Tensor:
        with torch.autocast(u.device.type, enabled=False):
            # (a grid gathers exactly when a graph is being captured)
            weights, bias = self.pos(grid.gathers)
            if not self.pos_only:
                weights = weights + self.token_proj_n_weight
            mixing = mixings_on_grids(weights[None], bias[None],
                                      [self.normalizes_over_keys], [grid])[0]
        return gate_tokens(u, v, mixing, grid)

    def extra_repr(self) -> str:
        return f'channels={self.channels}, pos_only={self.pos_only}'


def _check_token_matrix(module, state_dict, prefix, *args):
    """A learned N x N token matrix cannot be resized to another window."""
    key = prefix + 'token_proj_n_weight'
    value = state_dict.get(key)
    if value is not None and tuple(value.shape) != tuple(
            module.token_proj_n_weight.shape):
        raise ValueError(
            f'{key} has shape {tuple(value.shape)} but the model expects '
            f'{tuple(module.token_proj_n_weight.shape)}: an absolute N x N '
            f'token matrix (LRPE with pos_only=False) is tied to the window it '
            f'was trained with and cannot be resized; build the model with '
            f'that window')
