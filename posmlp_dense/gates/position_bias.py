"""Base of the positional encodings: the per-query bias and checkpoint hooks.

Both GQPE and LRPE (``gate_unit.pos``) carry ``token_proj_n_bias`` of shape
(1, wh * ww, 1): one value per query position of the window, shared by all
channels. This base also owns what happens when a state dict is loaded:

* derived buffers stored by the published code (offsets, relative indices)
  are dropped, since the model recomputes them from the window size;
* window-size-dependent tensors from a checkpoint made for another window
  are resized (bicubic), and each resize is logged once.

Doing this in a load_state_dict pre-hook means that ``load_pretrained``,
mmengine's init_cfg / load_from / resume, and a plain ``load_state_dict`` all
behave the same.
"""
from __future__ import annotations

import logging
from typing import Dict, Tuple

import torch
from torch import nn

from ..relative_position import (infer_window, lrpe_relative_index,
                                 resize_position_bias)

logger = logging.getLogger('posmlp_dense')

# Buffers the published checkpoints contain but that only restate the window
# geometry; dropped on load and recomputed.
DERIVED_BUFFERS = ('rel_indices', 'window_relative_position_index')


class PositionBias(nn.Module):
    # tensors whose shape follows the window; the load hook resizes them
    resizable_tensors: Tuple[str, ...] = ('token_proj_n_bias',)
    # whether each row of the weights is a softmax over the window's keys
    softmax: bool = False

    def __init__(self, window: Tuple[int, int]):
        super().__init__()
        self.window = tuple(window)
        self.token_proj_n_bias = nn.Parameter(
            torch.zeros(1, self.window[0] * self.window[1], 1))
        # (N * N,): the relative offset of each query/key pair of a window,
        # which both encodings' per-offset values are indexed by
        self.register_buffer('offset_index',
                             lrpe_relative_index(self.window).view(-1),
                             persistent=False)
        self.register_load_state_dict_pre_hook(_adapt_state_dict)

    @classmethod
    def stacked_weights(cls, modules, captured: bool = False) -> torch.Tensor:
        """(D, groups, N, N): the mixing weights of D encodings of this
        class (the formula of the encoding; see its module docstring).
        ``captured``: for a graph being captured (forward_mode.py), where
        an encoding may order its operations for the compiler."""
        raise NotImplementedError

    def forward(self, captured: bool = False
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        """This encoding's weights (groups, N, N) and per-query bias (N,)
        over a whole window: what ``stacked_weights`` and ``stacked_bias``
        give for it alone. The gate calls it where the block calls its
        modules (module_calls.py); the fast path stacks a level's."""
        return (type(self).stacked_weights([self], captured)[0],
                self.token_proj_n_bias.view(-1))

    @staticmethod
    def stacked_bias(modules, captured: bool = False):
        """(D, N): the per-query biases of D encodings; in a captured graph
        the list of their own (N,) (token_mixing.mixings_on_grids)."""
        biases = [m.token_proj_n_bias.view(-1) for m in modules]
        return biases if captured else torch.stack(biases)

    def checkpoint_window(self, state: Dict[str, torch.Tensor], prefix: str
                          ) -> Tuple[int, int]:
        """The window a checkpoint's tensors for this module were made for."""
        bias = state[prefix + 'token_proj_n_bias']
        return infer_window(bias.numel(), prefer=self.window)

    def resize_from_checkpoint(self, state, prefix, src_window):
        """Resize this module's window-dependent tensors in ``state``."""
        key = prefix + 'token_proj_n_bias'
        state[key] = resize_position_bias(state[key], src_window, self.window)
        return [key]


def _adapt_state_dict(module: PositionBias, state_dict, prefix, *args):
    for name in DERIVED_BUFFERS:
        state_dict.pop(prefix + name, None)
    if prefix + 'token_proj_n_bias' not in state_dict:
        return  # a missing key is reported by load_state_dict itself
    src = module.checkpoint_window(state_dict, prefix)
    if src == module.window:
        return
    before = {k: tuple(v.shape) for k, v in state_dict.items()
              if k.startswith(prefix)}
    for key in module.resize_from_checkpoint(state_dict, prefix, src):
        logger.info('resized %s from window %dx%d %s to window %dx%d %s',
                    key, src[0], src[1], before[key], module.window[0],
                    module.window[1], tuple(state_dict[key].shape))
