"""Scratch buffers that the blocks of a level share during inference.

Every block of a level produces intermediates of the same shapes.
Allocating them afresh costs more than it seems: large buffers come straight
from the operating system and every page is faulted in again on first write.
During inference (no autograd) a level hands its blocks one Workspace, and
they write their intermediates into its buffers with the ``out=`` forms of
the ops. Each name owns one flat storage that requests view (growing it when
one needs more), so consecutive uses of a name share memory. It lives for
one forward of one level.
"""
from __future__ import annotations

from typing import Dict, Hashable, Optional, Tuple

import torch


# Rows (tokens) a block works on at once in CPU inference: the run's
# intermediates (a few MB) then stay in the caches between the block's passes.
CPU_RUN_ROWS = 2048


class Workspace:
    """``max_rows``: the most token rows a block processes at once (None:
    whole window classes)."""

    def __init__(self, max_rows: Optional[int] = None):
        self.max_rows = max_rows
        self._storage: Dict[Hashable, torch.Tensor] = {}

    def reserve(self, name: Hashable, numel: int, like: torch.Tensor):
        """Make ``name``'s storage hold at least ``numel`` elements now (one
        allocation for the largest of the requests to come)."""
        self.get(name, (numel,), like)

    def get(self, name: Hashable, shape: Tuple[int, ...],
            like: torch.Tensor) -> torch.Tensor:
        """A contiguous buffer of ``shape`` with ``like``'s dtype and device.

        Its contents are undefined, and it is the same memory as the previous
        buffer of that name: a caller is done with one before asking again.
        """
        numel = 1
        for size in shape:
            numel *= size
        flat = self._storage.get(name)
        if flat is None or flat.numel() < numel or flat.dtype != like.dtype \
                or flat.device != like.device:
            flat = like.new_empty(numel)
            self._storage[name] = flat
        return flat[:numel].view(shape)


def in_place_inference(x: torch.Tensor) -> bool:
    """Whether a forward on ``x`` may overwrite its own intermediates: no
    autograd (nothing keeps them for a backward), no autocast (whose casts
    the out= forms would bypass) and no torch.compile (which fuses the
    plain forms by itself)."""
    return not (torch.is_grad_enabled()
                or torch.is_autocast_enabled(x.device.type)
                or torch.compiler.is_compiling())


def inference_workspace(x: torch.Tensor) -> Optional[Workspace]:
    """A Workspace for a level's forward on ``x`` when it may run in place
    (see in_place_inference), else None."""
    if not in_place_inference(x):
        return None
    return Workspace(CPU_RUN_ROWS if x.device.type == 'cpu' else None)
