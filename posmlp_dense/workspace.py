"""Scratch buffers that the blocks of a level share.

Every block of a level produces intermediates of the same shapes.
Allocating them afresh costs more than it seems: large buffers come straight
from the operating system and every page is faulted in again on first write.
In INFERENCE mode (forward_mode.py) a level hands its blocks one Workspace, and
they write their intermediates into its buffers with the ``out=`` forms of
the ops. Each name owns one flat storage that requests view (growing it when
one needs more), so consecutive uses of a name share memory. It lives for
one forward of one level.

The lean training Function (block_function.py) does the same with its
temporaries: a TrainingScratch holds one Workspace for the level's forward
and one for its backward, which runs the blocks in reverse and releases the
buffers after the level's first block.
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


def inference_workspace(device: torch.device) -> Workspace:
    """The Workspace of one level's INFERENCE-mode forward (forward_mode.py):
    cache-sized runs on the CPU, whole window classes elsewhere."""
    return Workspace(CPU_RUN_ROWS if device.type == 'cpu' else None)


class TrainingScratch:
    """The temporaries of one level's training forward and backward
    (AUTOGRAD mode): ``forward`` serves the blocks' forwards and goes with
    the level's forward call; ``backward`` is kept by the blocks' autograd
    nodes and emptied by the last of them to run (``release``)."""

    def __init__(self):
        self.forward = Workspace()
        self.backward = Workspace()

    def release(self):
        self.backward = Workspace()
