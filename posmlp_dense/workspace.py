"""Scratch buffers that the blocks of a level share during inference.

Every block of a level produces intermediates of the same shapes. Allocating
them afresh in each block costs more than it seems: large buffers come
straight from the operating system and every page is faulted in again on
first write. During inference (no autograd) a level hands its blocks one
Workspace, and they write their intermediates into its buffers with the
``out=`` forms of the ops. It lives for one forward of one level.
"""
from __future__ import annotations

from typing import Dict, Hashable, Tuple

import torch


class Workspace:

    def __init__(self):
        self._buffers: Dict[Hashable, torch.Tensor] = {}

    def get(self, name: Hashable, shape: Tuple[int, ...],
            like: torch.Tensor) -> torch.Tensor:
        """A buffer of ``shape`` with ``like``'s dtype and device."""
        shape = tuple(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape or buf.dtype != like.dtype \
                or buf.device != like.device:
            buf = like.new_empty(shape)
            self._buffers[name] = buf
        return buf
