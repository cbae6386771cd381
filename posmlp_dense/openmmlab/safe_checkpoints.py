"""Let ``torch.load(weights_only=True)`` read mmengine's own checkpoints.

Since torch 2.6 ``torch.load`` defaults to ``weights_only=True``. mmengine
0.10.7 calls it without the argument, and its training checkpoints hold a
few non-tensor objects: the message hub's ``HistoryBuffer`` (with numpy
arrays inside). ``resume`` and ``load_from`` then fail. Instead of turning
safe loading off, we allow exactly these types; anything else (code in a
pickle included) is still refused.
"""
from __future__ import annotations

import numpy as np
import torch
from mmengine.logging.history_buffer import HistoryBuffer

from ..checkpoint import register_safe_globals


def _numpy_types():
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    dtype_classes = [type(np.dtype(t)) for t in
                     ('float64', 'float32', 'float16', 'int64', 'int32',
                      'int16', 'int8', 'uint8', 'bool')]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtype_classes]


def allow_mmengine_checkpoints():
    types = [HistoryBuffer, *_numpy_types()]
    torch.serialization.add_safe_globals(types)
    register_safe_globals(*types)
