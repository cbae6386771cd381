"""GQPE: generalized quadratic positional encoding (the released gate).

Each channel group s has a learned 2-D Gaussian over relative offsets: a
centre delta_s (2,) and a spread A_s (2, 2). The mixing weights of a query
are a softmax over the keys of the window:

    S = A A^T;  a, b, c, d = S00, S01, S11, S10;  (d1, d2) = delta
    score[s, m, n] = (a d1 + b d2) dx + (c d2 + d d1) dy
                     - (a dx^2 + c dy^2 + (b + d) dx dy) / 2
    P_s[m, :] = softmax_n(score[s, m, :])

that is score = (S delta) . v - v^T S v / 2 for the offset v = (dx, dy).
The score depends on the offset alone, so eager computes it once per offset
((2wh-1) x (2ww-1) of them), and the window's N x N pairs index that
table before the softmax (a captured graph computes each pair's:
``softmax_weights`` says why).
The isotropic form (``generalized=False``) has a scalar spread sigma_s and,
as published, score = sigma^2 (d1 dx + d2 dy) - (dx^2 + dy^2) / 2: S delta
with S = sigma^2 I in the linear term, S = I in the quadratic one.

Parameters do not depend on the window; only the offsets (a non-persistent
buffer) and the per-query bias ``token_proj_n_bias`` do.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple

import torch
from torch import nn

from ..relative_position import (gqpe_features, gqpe_offset_features,
                                 window_coordinates)
from .position_bias import PositionBias

# Keys whose weight is below this fraction of the query's own weight get
# none. Such weights change a query's output by less than N * 2^-40 of it,
# far below float32 resolution, and matmuls whose operands are subnormal
# floats run several times slower on a CPU. The query's own key (offset 0,
# score 0) is always real, so the threshold never empties a row, and it is
# the same for a partial window as for the whole one.
NEGLIGIBLE_WEIGHT = 2.0 ** -40
NEGLIGIBLE_SCORE = math.log(NEGLIGIBLE_WEIGHT)


def score_terms(centers: torch.Tensor, spreads: torch.Tensor,
                generalized: bool = True, symmetric: bool = True,
                captured: bool = False
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The score's coefficients against an offset's features
    (relative_position.gqpe_features), in two terms: the linear
    coefficients S delta (..., groups, 2), and the quadratic form S
    flattened (..., groups, 4).

    ``centers`` (..., groups, 2); ``spreads`` (..., groups, 2, 2), or
    (..., groups) for the isotropic form. ``captured``: for a graph being
    captured (forward_mode.py), where the 2 x 2 products are written out,
    so that a compiler computes them inside the kernel that uses them (a
    matmul is a library call of its own); eager multiplies matrices,
    fewer operations."""
    if not generalized:
        linear = (spreads * spreads).unsqueeze(-1) * centers
        form = torch.eye(2, dtype=centers.dtype, device=centers.device)
        form = form.expand(*centers.shape[:-1], 2, 2)
    elif captured:
        form = spreads
        if symmetric:
            form = (spreads.unsqueeze(-2) * spreads.unsqueeze(-3)).sum(-1)
        linear = (form * centers.unsqueeze(-2)).sum(-1)
    else:
        form = spreads @ spreads.transpose(-1, -2) if symmetric else spreads
        linear = (form @ centers.unsqueeze(-1)).squeeze(-1)
    return linear, form.flatten(-2)


def score_coefficients(centers: torch.Tensor, spreads: torch.Tensor,
                       generalized: bool = True, symmetric: bool = True
                       ) -> torch.Tensor:
    """(..., groups, 6): ``score_terms`` as one vector, so that the score
    is its dot product with the offset's features."""
    return torch.cat(score_terms(centers, spreads, generalized, symmetric),
                     dim=-1)


def softmax_weights(terms: Tuple[torch.Tensor, torch.Tensor],
                    features: torch.Tensor, index: torch.Tensor,
                    coordinates: torch.Tensor, captured: bool = False
                    ) -> torch.Tensor:
    """(..., groups, N, N) softmax weights over a whole window's keys, keys
    of negligible weight dropped (NEGLIGIBLE_WEIGHT). ``terms``:
    ``score_terms``'; ``features``: the offsets'
    (relative_position.gqpe_offset_features); ``index`` (N * N,): each
    query/key pair's offset (relative_position.lrpe_relative_index);
    ``coordinates`` (2, N): the window's tokens'
    (relative_position.window_coordinates). ``captured``: for a graph
    being captured (forward_mode.py)."""
    if captured:
        # per query/key pair, term by term, from the tokens' coordinates: a
        # compiler computes the scores in one vectorized kernel with their
        # coefficients, where a matmul is a library call, a concatenation
        # of the coefficients a copy, and gathering a pair's offset (here,
        # or the softmax from a per-offset table) a load per element
        ys, xs = coordinates
        dx = xs - xs.unsqueeze(-1)                   # xn - xm, at [m, n]
        dy = ys.unsqueeze(-1) - ys                   # ym - yn
        coefficients = (*terms[0].unbind(-1), *terms[1].unbind(-1))
        products = [c[..., None, None] * f for c, f in zip(
            coefficients, gqpe_features(dx, dy))]
        scores = products[0]
        for product in products[1:]:
            scores = scores + product
        return _drop_negligible(scores, captured).softmax(-1)
    # per offset by one matmul, then gathered: fewer operations
    n = coordinates.shape[-1]
    scores = _drop_negligible(
        torch.cat(terms, dim=-1) @ features.t()).index_select(-1, index)
    return scores.unflatten(-1, (n, n)).softmax(-1)


def _drop_negligible(scores: torch.Tensor, captured: bool = False
                     ) -> torch.Tensor:
    """-inf where a score gives a weight below NEGLIGIBLE_WEIGHT.
    ``captured`` without autograd (an inference graph, which inductor's
    freezing may compute at compile time): by adding log(0) there and
    log(1) = 0 elsewhere, not by filling in a constant, from which
    freezing computes nothing (so neither the softmax after it). A
    training graph fills it in: its backward is leaner so."""
    if captured and not scores.requires_grad:
        kept = scores >= NEGLIGIBLE_SCORE
        return scores + kept.to(scores.dtype).log()
    return scores.masked_fill(scores < NEGLIGIBLE_SCORE, float('-inf'))


class GQPE(PositionBias):
    softmax = True

    def __init__(self, window: Tuple[int, int], groups: int,
                 generalized: bool = True, symmetric: bool = True,
                 init_std: float = 1e-2):
        super().__init__(window)
        self.groups = groups
        self.generalized = generalized
        self.symmetric = symmetric
        self.init_std = init_std
        self.attention_centers = nn.Parameter(torch.zeros(groups, 2))
        if generalized:
            self.attention_spreads = nn.Parameter(torch.zeros(groups, 2, 2))
        else:
            self.attention_spreads = nn.Parameter(torch.zeros(groups))
        self.register_buffer('offset_features',
                             gqpe_offset_features(self.window),
                             persistent=False)
        self.register_buffer('token_coordinates',
                             window_coordinates(self.window),
                             persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.attention_centers, 0.0, self.init_std)
        with torch.no_grad():
            if self.generalized:
                eye = torch.eye(2).expand(self.groups, 2, 2)
                self.attention_spreads.copy_(
                    eye + torch.randn(self.groups, 2, 2) * self.init_std)
            else:
                self.attention_spreads.copy_(
                    1 + torch.randn(self.groups) * self.init_std)
        nn.init.zeros_(self.token_proj_n_bias)

    def score_coefficients(self) -> torch.Tensor:
        """(groups, 6): this encoding's ``score_coefficients``."""
        return score_coefficients(self.attention_centers,
                                  self.attention_spreads, self.generalized,
                                  self.symmetric)

    @classmethod
    def stacked_weights(cls, modules: Sequence['GQPE'],
                        captured: bool = False) -> torch.Tensor:
        first = modules[0]
        centers = torch.stack([m.attention_centers for m in modules])
        spreads = torch.stack([m.attention_spreads for m in modules])
        terms = score_terms(centers, spreads, first.generalized,
                            first.symmetric, captured)
        return softmax_weights(terms, first.offset_features,
                               first.offset_index, first.token_coordinates,
                               captured)

    def extra_repr(self) -> str:
        return (f'window={self.window}, groups={self.groups}, '
                f'generalized={self.generalized}')
