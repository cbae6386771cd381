"""Let mmengine read its own checkpoints with ``weights_only=True``.

Since torch 2.6 ``torch.load`` defaults to ``weights_only=True``. mmengine
0.10.7 calls it without the argument, and its training checkpoints hold a few
non-tensor objects: the message hub's ``HistoryBuffer`` (numpy arrays inside,
and its statistics methods, pickled as ``getattr(HistoryBuffer, 'mean')``).
``resume`` and ``load_from`` then fail.

Instead of turning safe loading off we allow exactly these types, and only
where they are needed: mmengine's loader for local files is replaced by one
that passes them to ``torch.load(weights_only=True)`` for that call, and the
package's own reader (pretrained weights, the visualization tool) accepts
them too. Nothing is added to torch's process-wide allowlist. ``getattr``
is harmless here: the safe unpickler only ever calls allowlisted functions.
"""
from __future__ import annotations

import builtins
import os.path as osp

import numpy as np
import torch
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader

from ..checkpoint import register_safe_globals


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
    """mmengine's local-file loader, with safe loading kept on."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    with torch.serialization.safe_globals(mmengine_checkpoint_types()):
        return torch.load(filename, map_location=map_location,
                          weights_only=True)


def allow_mmengine_checkpoints():
    CheckpointLoader.register_scheme(
        prefixes='', loader=load_from_local_weights_only, force=True)
    register_safe_globals(*mmengine_checkpoint_types())
