"""The measured steps of a backbone (an NCHW tensor in, a tensor or a
tuple out): inference (eval, no autograd) and a training step (train
mode, forward, a loss, backward); and the bytes autograd saves."""
from __future__ import annotations

from typing import Callable, Dict, Iterable, Tuple

import torch
from torch import nn

# the steps' names on command lines and in the JSON, and their mode
STEP_MODES = {'inference': 'fwd', 'train': 'fwdbwd'}


def make_input(size: Tuple[int, int], batch: int, device: torch.device,
               seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(
        seed + 1000 * batch + size[0] + size[1])
    return torch.randn(batch, 3, *size, generator=gen).to(device)


def make_step(model: nn.Module, mode: str) -> Callable[[torch.Tensor], None]:
    """One call of ``model`` in ``mode``: 'fwd' or 'fwdbwd'. The loss sums
    the first half of every level's channels: a sum of all channels (or of
    squares) of layer-normalized outputs is constant while the norms are
    at their initial values, and its gradient would be rounding residue."""
    if mode == 'fwd':
        def step(x):
            with torch.no_grad():
                model(x)
    elif mode == 'fwdbwd':
        def step(x):
            outs = model(x)
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            sum(o[:, :o.shape[1] // 2].float().sum() for o in outs
                ).backward()
    else:
        raise ValueError(f'unknown mode {mode!r}')
    return step


def set_mode(model: nn.Module, mode: str):
    """eval for 'fwd', train for 'fwdbwd'; no call when already so
    (PosMLP's ``train()``/``eval()`` drop its cached mixing matrices)."""
    training = mode != 'fwd'
    if any(m.training != training for m in model.modules()):
        model.train(training)
    model.zero_grad(set_to_none=True)


def step_name(mode: str, shape) -> str:
    """'train 2x3x512x512' for a step of ``shape`` = (B, H, W)."""
    return f"{mode} {'x'.join(map(str, [shape[0], 3, *shape[1:]]))}"


class SavedActivations:
    """Bytes autograd keeps for the backward while inside, each storage
    once however many operations save it or views of it; those of
    ``exclude`` (parameters, buffers) go to ``excluded_bytes``."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._excluded = {self._key(t) for t in exclude}
        self._storages: Dict[tuple, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(
            self._pack, lambda t: t)

    @staticmethod
    def _key(t: torch.Tensor) -> tuple:
        return t.device, t.untyped_storage().data_ptr()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._storages[self._key(t)] = t.untyped_storage().nbytes()
        return t

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)

    @property
    def activation_bytes(self) -> int:
        return sum(n for k, n in self._storages.items()
                   if k not in self._excluded)

    @property
    def excluded_bytes(self) -> int:
        return sum(n for k, n in self._storages.items()
                   if k in self._excluded)
