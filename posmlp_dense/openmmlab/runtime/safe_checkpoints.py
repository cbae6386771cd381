"""mmengine reads local checkpoints safely, with errors that name the file.

mmengine 0.10.7 reads ``load_from`` and ``--resume`` checkpoints with a bare
``torch.load``. Since torch 2.6 that means ``weights_only=True`` anyway, but
mmengine's training checkpoints hold a few non-tensor objects (the message
hub's ``HistoryBuffer`` with numpy arrays inside, and its statistics methods,
pickled as ``getattr(HistoryBuffer, 'mean')``), so ``resume`` fails; and a
truncated or corrupt file ends in an unpickler traceback.

Importing ``posmlp_dense.openmmlab.runtime`` registers
``load_from_local_weights_only`` as mmengine's loader for local files
(``CheckpointLoader``'s own extension point, the scheme ``''``): the
package's checked reader (``read_checkpoint``: ``weights_only=True``, a
message for a truncated, corrupt or unsafe file), with exactly those types
allowed, for the duration of the call only. ``getattr`` is harmless there:
the safe unpickler only ever calls allowlisted functions.
"""
from __future__ import annotations

import builtins
import os.path as osp

import numpy as np
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader

from ...checkpoint import allowing, read_checkpoint


def mmengine_checkpoint_types() -> list:
    """What an mmengine training checkpoint holds besides tensors."""
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    dtype_classes = [type(np.dtype(t)) for t in
                     ('float64', 'float32', 'float16', 'int64', 'int32',
                      'int16', 'int8', 'uint8', 'bool')]
    return [HistoryBuffer, builtins.getattr, _reconstruct, scalar,
            np.ndarray, np.dtype, *dtype_classes]


def load_from_local_weights_only(filename, map_location=None) -> dict:
    """mmengine's loader for local files (``load_from``, resume); named like
    mmengine's own loaders, which its log quotes ('Loads checkpoint by
    local_weights_only backend')."""
    with allowing(mmengine_checkpoint_types()):
        return read_checkpoint(osp.expanduser(filename), map_location)


CheckpointLoader.register_scheme(
    prefixes='', loader=load_from_local_weights_only, force=True)

__all__ = ['load_from_local_weights_only', 'mmengine_checkpoint_types']
