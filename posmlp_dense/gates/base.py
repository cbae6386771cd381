"""What every gate unit shares: mixing matrices per window class, cached.

A gate's mixing matrices depend only on its parameters and on the window
geometry, never on the input. In eval mode (and whenever no gradient to the
gate's parameters is needed) they are computed once per window class and
reused until a parameter changes: the cache key holds each parameter's
version counter and storage, which every in-place update (optimizer step,
``load_state_dict``) or re-assignment changes, and ``train()`` clears it.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Tuple

import torch
from torch import nn

from ..token_mixing import (mix_channel_major, mix_padded_windows,
                            mix_tokens)
from ..windows import PaddedWindows, in_window_index

Key = Tuple[int, int, int, int]


class GateUnit(nn.Module):
    """Base of the gates: subclasses implement ``compute_mixing``."""

    def __init__(self, window: Tuple[int, int], groups: int):
        super().__init__()
        self.window = tuple(window)
        self.groups = groups
        self._mixing_cache: Dict[tuple, tuple] = {}
        self._index_cache: Dict[tuple, torch.Tensor] = {}
        # Whether the gate reads its channels group-major. Set by gates with
        # several groups, whose published channel k is in group k % groups:
        # reading them group-major (posgu.to_group_major) keeps each group's
        # channels contiguous, so the token mixing re-arranges runs of
        # values instead of single ones. The block permutes its
        # projections' weights to match.
        self.group_major = False

    @property
    def num_positions(self) -> int:
        return self.window[0] * self.window[1]

    def token_index(self, key: Key, device) -> torch.Tensor:
        """In-window indices of the real tokens of a window class."""
        cache_key = (key, str(device))
        index = self._index_cache.get(cache_key)
        if index is None:
            index = in_window_index(key, self.window, device=device)
            self._index_cache[cache_key] = index
        return index

    def compute_mixing(self, index: torch.Tensor
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Mixing matrices (groups, n, n) and bias (n,) for these tokens."""
        raise NotImplementedError

    def full_window_mixing(self) -> Tuple[torch.Tensor, torch.Tensor, bool]:
        """For a captured graph (padded windows): the full window's weights
        (groups, N, N), bias (N,), and whether the weights are softmax
        numerators to be normalized over each window's real keys (GQPE).
        Computed in the graph from the parameters, never cached."""
        raise NotImplementedError

    def mix(self, u: torch.Tensor, v: torch.Tensor, windows
            ) -> torch.Tensor:
        """Gated mixing of u into v over ``windows``: padded windows (a
        captured graph) or a sequence of WindowRuns (exact windows)."""
        if isinstance(windows, PaddedWindows):
            weights, bias, normalize = self.full_window_mixing()
            return mix_padded_windows(u, v, windows, self.groups, weights,
                                      bias, normalize)
        return mix_tokens(u, v, windows, self.groups, self.augmented_mixing)

    def forward_channel_major(self, hidden: torch.Tensor, run,
                              workspace) -> torch.Tensor:
        """INFERENCE mode, one WindowRun: ``hidden`` (2K, run.rows),
        activated and stored channel-major (token_mixing.py) -> the gated
        product (K, run.rows), written over ``hidden``'s second half."""
        u, v = hidden.chunk(2, dim=0)
        return mix_channel_major(self.channel_major_input(u), v, run,
                                 self.groups, self.augmented_mixing,
                                 workspace)

    def channel_major_input(self, u: torch.Tensor) -> torch.Tensor:
        """What the gate mixes, from channel-major u (as ``forward`` does
        from token-major u)."""
        return u

    def augmented_mixing(self, key: Key, fresh: bool = False,
                         workspace=None) -> torch.Tensor:
        """(groups, n, n + 1): the mixing matrices with the bias appended.

        The form the token mixing consumes (the bias multiplies a row of
        ones). Cached in eval mode, see the module docstring; ``fresh``:
        computed from the parameters whatever the mode (the lean training
        Function, which runs with grad off but needs current values).
        ``workspace``: where computations without grad may keep their
        temporaries (workspace.py).
        """
        params = tuple(self.parameters())
        device = params[0].device
        needs_grad = torch.is_grad_enabled() and any(
            p.requires_grad for p in params)
        if self.training or needs_grad or fresh:
            with torch.autocast(device.type, enabled=False):
                return self._augmented(key, device, workspace)
        stamp = tuple((p._version, p.data_ptr()) for p in params)
        cache_key = (key, str(device))
        hit = self._mixing_cache.get(cache_key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            result = self._augmented(key, device)
        self._mixing_cache[cache_key] = (stamp, result)
        return result

    def _augmented(self, key: Key, device, workspace=None) -> torch.Tensor:
        index = self.token_index(key, device)
        if not torch.is_grad_enabled():
            return self.augmented_without_grad(index, workspace)
        return append_bias(*self.compute_mixing(index))

    def augmented_without_grad(self, index: torch.Tensor, workspace=None
                               ) -> torch.Tensor:
        """``_augmented`` when no graph is recorded: a gate may compute it
        in place, in fewer passes and allocations."""
        return append_bias(*self.compute_mixing(index))

    def sharing_parameter_terms(self):
        """A context within which matrices computed without grad may share
        the terms that depend on the parameters alone, computed once for
        several window classes. None to share by default."""
        return contextlib.nullcontext()

    @property
    def has_mixing_backward(self) -> bool:
        """Whether ``mixing_backward`` is implemented."""
        return False

    def mixing_backward(self, keys, augmented, d_augmented):
        """Optional analytic backward of ``augmented_mixing``: given each
        window class's augmented matrix and its gradient, the parameters'
        gradients, by name (as ``named_parameters`` gives it; a parameter
        left out gets none). None (the default): the caller recomputes the
        matrices with autograd instead."""
        return None

    def mixing_matrices(self, key: Key) -> Tuple[torch.Tensor, torch.Tensor]:
        """The model's own mixing matrices (groups, n, n) and bias (n,) for
        the real tokens of a window class; ``key`` is the in-window
        rectangle (r0, r1, c0, c1), the full window (0, wh, 0, ww)."""
        augmented = self.augmented_mixing(key)
        return augmented[..., :-1], augmented[0, :, -1]

    def clear_cache(self):
        self._mixing_cache.clear()

    def train(self, mode: bool = True):
        self.clear_cache()
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):
        # .to() / .half() / .cuda(): cached tensors would be stale
        self._mixing_cache.clear()
        self._index_cache.clear()
        return super()._apply(fn, *args, **kwargs)


def append_bias(weights: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """(groups, n, n) weights and (n,) bias -> (groups, n, n + 1)."""
    groups, n, _ = weights.shape
    return torch.cat([weights, bias.view(1, n, 1).expand(groups, n, 1)],
                     dim=2)
