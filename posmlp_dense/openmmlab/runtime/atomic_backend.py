"""mmengine's local file backend with writes that a kill cannot tear.

mmengine's ``LocalBackend.put`` opens the final path and writes into it, so a
run killed while a checkpoint is being written (SIGKILL, the OOM killer, a
preempted node) leaves a truncated ``epoch_N.pth`` under the real name.
``AtomicLocalBackend`` writes through ``posmlp_dense.atomic_io``: under the
final name there is always the previous file or the complete new one.
Configs select it by name::

    default_hooks = dict(checkpoint=dict(
        type='AtomicCheckpointHook',
        backend_args=dict(backend='local_atomic')))

Registered when ``posmlp_dense.openmmlab.runtime`` is imported.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Union

from mmengine.fileio import LocalBackend, register_backend

from ... import atomic_io

BACKEND_NAME = 'local_atomic'


class AtomicLocalBackend(LocalBackend):
    """``LocalBackend`` whose ``put`` and ``put_text`` replace the file in
    one atomic rename; reading, listing and removing are mmengine's."""

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        atomic_io.atomic_write_bytes(obj, filepath)

    def put_text(self, obj: str, filepath: Union[str, Path],
                 encoding: str = 'utf-8') -> None:
        atomic_io.atomic_write_bytes(obj.encode(encoding), filepath)


register_backend(BACKEND_NAME, AtomicLocalBackend)

__all__ = ['AtomicLocalBackend', 'BACKEND_NAME']
