"""Let mmengine read its own checkpoints with ``weights_only=True``.

Since torch 2.6 ``torch.load`` defaults to ``weights_only=True``. mmengine
0.10.7 calls it without the argument, and its training checkpoints hold a few
non-tensor objects: the message hub's ``HistoryBuffer`` (numpy arrays inside,
and its statistics methods, pickled as ``getattr(HistoryBuffer, 'mean')``).
``resume`` and ``load_from`` then fail.

Instead of turning safe loading off we allow exactly these types, and only
where they are needed: mmengine's loader for local files is replaced by the
package's own checked reader (``read_checkpoint``: ``weights_only=True``,
and a message that names a truncated, corrupt or unsafe file), which accepts
them for its calls only. Nothing is added to torch's process-wide allowlist. ``getattr``
is harmless here: the safe unpickler only ever calls allowlisted functions.
"""
from __future__ import annotations

import builtins
import os.path as osp

import numpy as np
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader

from ...checkpoint import read_checkpoint, register_safe_globals


def mmengine_checkpoint_types() -> list:
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    dtype_classes = [type(np.dtype(t)) for t in
                     ('float64', 'float32', 'float16', 'int64', 'int32',
                      'int16', 'int8', 'uint8', 'bool')]
    return [HistoryBuffer, builtins.getattr, _reconstruct, scalar,
            np.ndarray, np.dtype, *dtype_classes]


def load_from_local_weights_only(filename, map_location):
    """mmengine's local-file loader (resume, load_from), with safe loading
    kept on and clear errors for bad files."""
    return read_checkpoint(osp.expanduser(filename), map_location)


def allow_mmengine_checkpoints():
    CheckpointLoader.register_scheme(
        prefixes='', loader=load_from_local_weights_only, force=True)
    register_safe_globals(*mmengine_checkpoint_types())
