"""PoSGU: the positional gating unit of PosMLP.

The block's hidden channels are split into halves u, v (``chunk(2)``); the
gate returns PosMap(u) * v, where PosMap mixes the tokens of each window with
the per-group matrices of a positional encoding (GQPE or LRPE, at
``gate_unit.pos``) and adds a per-query bias.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn
from timm.layers import trunc_normal_

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
        self.group_major = groups > 1
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
        self.pos_only = pos_only
        if not pos_only:
            # LRPE's "pos_only=False": a learned (1, N, N) matrix added to
            # every group's weights.
            self.token_proj_n_weight = nn.Parameter(
                torch.zeros(1, self.num_positions, self.num_positions))
            trunc_normal_(self.token_proj_n_weight, std=1e-6)
            self.register_load_state_dict_pre_hook(_check_token_matrix)

    def compute_mixing(self, index):
        weights = self.pos.weights(index)
        if not self.pos_only:
            weights = weights + self.token_proj_n_weight[:, index][:, :, index]
        return weights, self.pos.bias(index)

    def augmented_without_grad(self, index, workspace=None):
        n = index.numel()
        bias = self.pos.bias(index)
        augmented = bias.new_empty(self.groups, n, n + 1)
        weights = augmented[..., :n]
        self.pos.write_weights(index, weights, workspace)
        if not self.pos_only:
            weights += self.token_proj_n_weight[:, index][:, :, index]
        augmented[..., n] = bias
        return augmented

    @property
    def has_mixing_backward(self) -> bool:
        return isinstance(self.pos, GQPE)

    def sharing_parameter_terms(self):
        if isinstance(self.pos, GQPE):
            return self.pos.sharing_parameter_terms()
        return super().sharing_parameter_terms()

    def mixing_backward(self, keys, augmented, d_augmented):
        """GQPE: the gradients of its centres, spreads and position bias
        (GQPE.coefficients_gradient, then GQPE.parameter_gradients;
        ``d_augmented`` is overwritten); LRPE: None (recomputed)."""
        if not self.has_mixing_backward:
            return None
        d_coefficients = 0
        d_bias = augmented[0].new_zeros(self.num_positions)
        for key, aug, d_aug in zip(keys, augmented, d_augmented):
            index = self.token_index(key, aug.device)
            n = index.numel()
            # the bias column is shared by the groups (read first: the
            # coefficients' gradient overwrites d_aug)
            d_bias.index_add_(0, index, d_aug[..., n].sum(dim=0))
            d_coefficients = d_coefficients + self.pos.coefficients_gradient(
                index, aug, d_aug)
        grads = {f'pos.{name}': grad for name, grad in
                 self.pos.parameter_gradients(d_coefficients).items()}
        grads['pos.token_proj_n_bias'] = d_bias.view_as(
            self.pos.token_proj_n_bias)
        return grads

    def full_window_mixing(self):
        weights, normalize = self.pos.full_window_weights()
        if not self.pos_only:
            weights = weights + self.token_proj_n_weight
        return weights, self.pos.token_proj_n_bias.view(-1), normalize

    def forward(self, hidden: torch.Tensor, windows) -> torch.Tensor:
        """``hidden`` (T, 2K), activated, -> (T, K). Both halves of
        ``hidden`` and the result have their channels group-major
        (``to_group_major``) when the gate has several groups."""
        u, v = hidden.chunk(2, dim=-1)
        return self.mix(u, v, windows)

    def extra_repr(self) -> str:
        return f'channels={self.channels}, pos_only={self.pos_only}'


def to_group_major(w_e, b_e, w_s, groups: int):
    """proj_c_e's weight (2K, C) and bias and proj_c_s's weight (C, K) with
    the gate's channels group-major: in each half, published channel
    p * groups + s moves to s * V + p (V = K / groups), a transpose of
    (V, groups)."""
    K2, C = w_e.shape
    V = K2 // 2 // groups
    return (w_e.view(2, V, groups, C).transpose(1, 2).reshape(K2, C),
            b_e.view(2, V, groups).transpose(1, 2).reshape(K2),
            w_s.view(-1, V, groups).transpose(1, 2).reshape(w_s.shape))


def from_group_major(d_w_e, d_b_e, d_w_s, groups: int):
    """The inverse of ``to_group_major``, for gradients (None passes)."""
    if d_w_e is not None:
        V = d_w_e.shape[0] // 2 // groups
        d_w_e = d_w_e.view(2, groups, V, -1).transpose(1, 2).reshape(
            d_w_e.shape)
    if d_b_e is not None:
        V = d_b_e.shape[0] // 2 // groups
        d_b_e = d_b_e.view(2, groups, V).transpose(1, 2).reshape(d_b_e.shape)
    if d_w_s is not None:
        V = d_w_s.shape[1] // groups
        d_w_s = d_w_s.view(-1, groups, V).transpose(1, 2).reshape(
            d_w_s.shape)
    return d_w_e, d_b_e, d_w_s


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
