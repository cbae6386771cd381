"""GQPE: generalized quadratic positional encoding (the released gate).

Each channel group s has a learned 2-D Gaussian over relative offsets: a
centre delta_s (2,) and a spread A_s (2, 2). The mixing weights of a query
are a softmax over the keys of the window:

    S = A A^T;  a, b, c, d = S00, S01, S11, S10;  (d1, d2) = delta
    score[s, m, n] = (a d1 + b d2) dx + (c d2 + d d1) dy
                     - (a dx^2 + c dy^2 + (b + d) dx dy) / 2
    P_s[m, :] = softmax_n(score[s, m, :])

The isotropic form (``generalized=False``) has a scalar spread sigma_s and,
as published, score = sigma^2 (d1 dx + d2 dy) - (dx^2 + dy^2) / 2.

Parameters do not depend on the window; only the offsets (a non-persistent
buffer) and the per-query bias ``token_proj_n_bias`` do.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Tuple

import torch
from torch import nn

from ..relative_position import gqpe_offset_features
from .position_bias import PositionBias

# Softmax weights below this are set to zero. At initialization most of a
# window's weights are far below 1e-38 (subnormal floats), and CPU matmuls
# whose inputs or products are subnormal run several times slower; in the
# backward pass tiny weights times small gradients land there too. All
# weights of a query sum to 1, so the dropped ones change an output by less
# than N * 2^-40 (< 2e-10 for N = 196) times the largest mixed value: far
# below fp32 resolution (2^-24).
NEGLIGIBLE_WEIGHT = 2.0 ** -40


class GQPE(PositionBias):

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
        self.register_buffer(
            'rel_indices', gqpe_offset_features(self.window, generalized),
            persistent=False)
        self._features_cache = {}
        self._shared_coefficients = None
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
        """(groups, features): the score is features . coefficients."""
        if self._shared_coefficients is not None and \
                not torch.is_grad_enabled():
            return self._shared_coefficients
        return self._coefficients()

    @contextmanager
    def sharing_parameter_terms(self):
        """Within: computations without grad reuse one computation of the
        score coefficients, for all the window classes of a block. That
        saves a dozen small operations (each a kernel launch on a GPU) per
        window class. Scoped to one call, so no parameter update can make
        them stale."""
        device = self.attention_centers.device.type
        with torch.no_grad(), torch.autocast(device, enabled=False):
            self._shared_coefficients = self._coefficients()
        try:
            yield
        finally:
            self._shared_coefficients = None

    def _coefficients(self) -> torch.Tensor:
        d1, d2 = self.attention_centers[:, 0], self.attention_centers[:, 1]
        if not self.generalized:
            a = self.attention_spreads ** 2
            return torch.stack([a * d1, a * d2, torch.full_like(d1, -0.5)],
                               dim=-1)
        spreads = self.attention_spreads
        inv_cov = spreads @ spreads.transpose(1, 2) if self.symmetric \
            else spreads
        a, b = inv_cov[:, 0, 0], inv_cov[:, 0, 1]
        c, d = inv_cov[:, 1, 1], inv_cov[:, 1, 0]
        return torch.stack([a * d1 + b * d2, c * d2 + d * d1,
                            -0.5 * a, -0.5 * c, -0.5 * (b + d)], dim=-1)

    def weights(self, index: torch.Tensor) -> torch.Tensor:
        """(groups, n, n) softmax mixing weights among the given tokens."""
        n = index.numel()
        scores = self._scores(index).view(self.groups, n, n)
        # weights below NEGLIGIBLE_WEIGHT -> 0, in one pass
        return torch.nn.functional.threshold(scores.softmax(dim=-1),
                                             NEGLIGIBLE_WEIGHT, 0.0)

    def write_weights(self, index, out, workspace=None):
        """``weights`` without autograd and without fresh (groups, n, n)
        tensors when a ``workspace`` is given: the scores and the softmax
        in its buffers, the thresholded weights straight into ``out`` (the
        caller's augmented matrix). The same kernels as ``weights``, so the
        same values."""
        n = index.numel()
        shape, like = (self.groups, n, n), self.attention_centers
        if workspace is None:
            scores, softmax = (like.new_empty(shape) for _ in range(2))
        else:
            scores = workspace.get('gate_scores', shape, like)
            softmax = workspace.get('gate_softmax', shape, like)
        self._scores(index, out=scores.view(self.groups, n * n))
        torch.softmax(scores, dim=-1, out=softmax)
        torch.threshold(softmax, NEGLIGIBLE_WEIGHT, 0.0, out=out)

    def _scores(self, index: torch.Tensor, out=None) -> torch.Tensor:
        """(groups, n * n): scores[s, m * n + k] = feats[m, k] .
        coefficients[s], as one matmul (written into ``out`` if given)."""
        n = index.numel()
        feats = self.geometry(index, self.rel_indices)
        return torch.mm(self.score_coefficients(),
                        feats.reshape(n * n, -1).t(), out=out)

    def coefficients_gradient(self, index: torch.Tensor,
                              augmented: torch.Tensor,
                              d_augmented: torch.Tensor) -> torch.Tensor:
        """d(score coefficients) (groups, features) from the gradient of an
        augmented matrix (groups, n, n + 1): ``weights(index)`` and a bias
        column (whose gradient the caller has read: ``d_augmented`` is
        overwritten). Without autograd: the softmax's backward
        dS = P * dP - P * rowsum(P * dP), then the features' transpose. With
        the thresholded P the dropped weights pass no gradient, which
        autograd through ``weights`` gives up to their own size (below
        NEGLIGIBLE_WEIGHT times the row's gradient)."""
        n = index.numel()
        weights, d_weights = augmented[..., :n], d_augmented[..., :n]
        # P * dP - P * rowsum(P * dP), in place: no (groups, n, n) temporary
        d_weights.mul_(weights)
        d_weights.addcmul_(weights, d_weights.sum(dim=-1, keepdim=True),
                           value=-1.0)
        # the bias column meets zero features. (features^T @ d^T)^T: with
        # the long reduction over the entries in the first operand's rows
        # this runs 4x faster than d @ features on a CPU
        return self._augmented_features(index).mm(
            d_augmented.reshape(self.groups, -1).t()).t()

    def _augmented_features(self, index: torch.Tensor) -> torch.Tensor:
        """(features, n * (n + 1)): the offset features of an augmented
        matrix's entries, zero in its bias column. Cached per window class,
        like ``geometry``."""
        key = (index.data_ptr(), index.numel())
        cached = self._features_cache.get(key)
        if cached is None or cached[0] is not index:
            feats = self.geometry(index, self.rel_indices)
            n, f = feats.shape[0], feats.shape[-1]
            padded = feats.new_zeros(n, n + 1, f)
            padded[:, :n] = feats
            cached = (index, padded.view(n * (n + 1), f).t().contiguous())
            self._features_cache[key] = cached
        return cached[1]

    def parameter_gradients(self, d_coefficients: torch.Tensor
                            ) -> Dict[str, torch.Tensor]:
        """The centres' and spreads' gradients from those of
        ``score_coefficients`` (groups, features), in closed form: the
        derivative of each coefficient formula (module docstring), with
        dA = (dS + dS^T) A for the symmetric spread S = A A^T. No autograd
        graph: a handful of operations per block instead of a graph of a
        few dozen."""
        G = d_coefficients
        centers = self.attention_centers
        d1, d2 = centers[:, 0], centers[:, 1]
        if not self.generalized:
            sigma = self.attention_spreads
            square = sigma * sigma
            d_centers = torch.stack([G[:, 0] * square, G[:, 1] * square],
                                    dim=-1)
            d_spreads = 2 * sigma * (G[:, 0] * d1 + G[:, 1] * d2)
            return {'attention_centers': d_centers,
                    'attention_spreads': d_spreads}
        spreads = self.attention_spreads
        inv_cov = spreads @ spreads.transpose(1, 2) if self.symmetric \
            else spreads
        a, b = inv_cov[:, 0, 0], inv_cov[:, 0, 1]
        c, d = inv_cov[:, 1, 1], inv_cov[:, 1, 0]
        d_centers = torch.stack([G[:, 0] * a + G[:, 1] * d,
                                 G[:, 0] * b + G[:, 1] * c], dim=-1)
        # d(score coefficients) / d(inverse covariance), entry by entry
        d_inv_cov = torch.stack([
            torch.stack([G[:, 0] * d1 - 0.5 * G[:, 2],
                         G[:, 0] * d2 - 0.5 * G[:, 4]], dim=-1),
            torch.stack([G[:, 1] * d1 - 0.5 * G[:, 4],
                         G[:, 1] * d2 - 0.5 * G[:, 3]], dim=-1)], dim=1)
        if self.symmetric:
            d_spreads = (d_inv_cov + d_inv_cov.transpose(1, 2)) @ spreads
        else:
            d_spreads = d_inv_cov
        return {'attention_centers': d_centers,
                'attention_spreads': d_spreads}

    def _apply(self, fn, *args, **kwargs):
        self._features_cache.clear()
        return super()._apply(fn, *args, **kwargs)

    def full_window_weights(self):
        """(groups, N, N) unnormalized softmax weights of the full window,
        for padded windows, where each row is normalized over a window's
        real keys (token_mixing.mix_padded_windows).

        exp(score - shift) with shift = max(row max - 60, 0): the zero
        offset (the query itself, always a real key) scores 0, so its
        weight exp(-shift) keeps every real-key sum far from underflow,
        while no weight can overflow. Weights below NEGLIGIBLE_WEIGHT times
        that query's own weight are dropped, as in ``weights``.
        """
        scores = torch.einsum('mnf,sf->smn', self.rel_indices,
                              self.score_coefficients())
        shift = (scores.amax(dim=-1, keepdim=True) - 60.0).clamp_min(0.0)
        numerators = torch.exp(scores - shift)
        floor = NEGLIGIBLE_WEIGHT * torch.exp(-shift)
        return torch.where(numerators < floor, torch.zeros_like(numerators),
                           numerators), True

    def extra_repr(self) -> str:
        return (f'window={self.window}, groups={self.groups}, '
                f'generalized={self.generalized}')
