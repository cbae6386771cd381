"""What every gate unit declares and shares.

A gate turns the block's activated hidden channels (u, v halves) into
``PosMap(u) * v``, where PosMap mixes the tokens of each window with weights
that depend on the gate's parameters and the window alone. A gate provides:

* ``stacked_weights(gates)``: the weights (D, groups, N, N) and per-query
  biases of D gates of its class at once (a level computes all its
  blocks' weights in one call; token_mixing.level_mixings). This is the
  one place each gate's formula lives.
* two declared flags, read by the forward instead of type checks:
  ``normalizes_over_keys`` (rows are a softmax over the window's keys, so
  partial windows are renormalized over their real keys) and
  ``lean_backward`` (the gate acts on u through its mixing operands alone,
  so the block may run the lean training Function, block_function.py).
* ``prepare_input(u)``: what the gate mixes, from channel-major u (K, B, H,
  W); u itself unless the gate transforms it first (SGU's LayerNorm).
* ``forward(u, v, grid)``: the gate on token-major halves (B, H, W, K),
  through its modules' calls (module_calls.py says when the block takes
  this path instead of its fused pass).
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
from torch import nn

from ..module_calls import must_call
from ..token_mixing import key_scale
from ..windows import WindowGrid, in_window_index


class GateUnit(nn.Module):
    normalizes_over_keys: bool = False
    lean_backward: bool = True

    def __init__(self, window: Tuple[int, int], groups: int):
        super().__init__()
        self.window = tuple(window)
        self.groups = groups

    @property
    def num_positions(self) -> int:
        return self.window[0] * self.window[1]

    @classmethod
    def stacked_weights(cls, gates: Sequence['GateUnit'],
                        captured: bool = False
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(weights (D, groups, N, N), bias (D, N)) of ``gates``, D of this
        class; ``captured`` for a graph being captured (forward_mode.py),
        where the bias is the list of each gate's own (N,)
        (token_mixing.mixings_on_grids says why)."""
        raise NotImplementedError

    def prepare_input(self, u: torch.Tensor) -> torch.Tensor:
        return u

    def forward(self, u: torch.Tensor, v: torch.Tensor, grid: WindowGrid
                ) -> torch.Tensor:
        """The gate's output on u, v (B, H, W, K), cut into windows by
        ``grid``, calling the gate's own modules."""
        raise NotImplementedError

    def needs_module_calls(self) -> bool:
        """Whether the block must call this gate (``forward``) rather than
        read its weights: a hook on it or on one of its modules, or a
        module of another class (module_calls.must_call)."""
        return must_call(*self._fast_path_modules())

    def _fast_path_modules(self):
        """(module, class) pairs whose arithmetic the fast path reproduces;
        by default every module as it is, so only hooks count."""
        return [(m, type(m)) for m in self.modules()]

    def mixing_matrices(self, rect=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The weights (groups, n, n) and bias (n,) that the forward applies
        among the n real tokens of a window whose real part is the in-window
        rectangle ``rect`` = (r0, r1, c0, c1) (default: the whole window).
        For analysis and tests; the forward computes the same thing for all
        windows at once."""
        wh, ww = self.window
        rect = (0, wh, 0, ww) if rect is None else tuple(rect)
        weights, bias = type(self).stacked_weights([self])
        weights, bias = weights[0], bias[0]
        index = in_window_index(rect, self.window, device=weights.device)
        rows = weights[:, index]
        if self.normalizes_over_keys:
            mask = torch.zeros(self.num_positions, dtype=weights.dtype,
                               device=weights.device)
            mask[index] = 1
            rows = rows * key_scale(weights, mask, index).unsqueeze(-1)
        return rows[:, :, index], bias[index]
