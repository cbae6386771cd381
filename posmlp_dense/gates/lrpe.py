"""LRPE: learned relative positional encoding.

Each channel group has a learned table over the (2wh - 1) x (2ww - 1)
relative offsets of a window; its mixing weight between a query and a key is
the table entry of their offset, with no softmax and no normalization:

    P_s[m, n] = table[index(m, n), s]

The table starts at zeros as published. A table made for another window is
resized as a (2wh-1) x (2ww-1) grid per group when a state dict is loaded.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
from torch import nn

from ..relative_position import (infer_window, resize_relative_table,
                                 table_grid)
from .position_bias import PositionBias


class LRPE(PositionBias):
    resizable_tensors = ('token_proj_n_bias',
                         'window_relative_position_bias_table')

    def __init__(self, window: Tuple[int, int], groups: int):
        super().__init__(window)
        self.groups = groups
        rows = table_grid(self.window)
        self.window_relative_position_bias_table = nn.Parameter(
            torch.zeros(rows[0] * rows[1], groups))

    def reset_parameters(self):
        nn.init.zeros_(self.window_relative_position_bias_table)
        nn.init.zeros_(self.token_proj_n_bias)

    @classmethod
    def stacked_weights(cls, modules: Sequence['LRPE'],
                        captured: bool = False) -> torch.Tensor:
        first = modules[0]
        n = first.window[0] * first.window[1]
        tables = torch.stack(
            [m.window_relative_position_bias_table for m in modules])
        index = first.offset_index
        # (D, offsets, groups) -> (D, groups, offsets), then the pairs'
        # offsets: one pass over the (D, groups, N, N) result
        return tables.transpose(1, 2).index_select(2, index).view(
            len(modules), first.groups, n, n)

    def checkpoint_window(self, state, prefix):
        bias = state[prefix + 'token_proj_n_bias']
        table = state.get(prefix + 'window_relative_position_bias_table')
        return infer_window(bias.numel(),
                            None if table is None else table.shape[0],
                            prefer=self.window)

    def resize_from_checkpoint(self, state, prefix, src_window):
        keys = super().resize_from_checkpoint(state, prefix, src_window)
        key = prefix + 'window_relative_position_bias_table'
        if key in state:
            state[key] = resize_relative_table(state[key], src_window,
                                               self.window)
            keys.append(key)
        return keys

    def extra_repr(self) -> str:
        return f'window={self.window}, groups={self.groups}'
