"""How a PosMLP backbone's windows cover its level maps at an input size.

The verification table names, for every size it checks, which levels tile
their windows, which have partial windows along the edges, and which fit
inside a single window, so that a reader can see the untiled cases were
really exercised.
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, Tuple

from torch import nn

from ..backbone import PosMLP


def find_posmlp(model: nn.Module) -> Optional[PosMLP]:
    """The model itself if it is a PosMLP, else its first PosMLP submodule."""
    for module in model.modules():
        if isinstance(module, PosMLP):
            return module
    return None


def window_class(size: Tuple[int, int], window: Tuple[int, int]) -> str:
    """'tiled', 'edge' (partial windows at the edges) or 'single' (the map
    is smaller than one window)."""
    (h, w), (wh, ww) = size, window
    if h % wh == 0 and w % ww == 0:
        return 'tiled'
    if h <= wh and w <= ww:
        return 'single'
    return 'edge'


def describe_coverage(backbone: PosMLP,
                      level_sizes: Sequence[Tuple[int, int]]) -> str:
    """E.g. 'L0-L1 edge, L2-L3 single' for the backbone's returned levels
    (``level_sizes`` in the order of ``backbone.out_indices``)."""
    groups: List[Tuple[str, List[int]]] = []
    for level, size in zip(backbone.out_indices, level_sizes):
        kind = window_class(tuple(size), backbone.specs[level].window)
        if groups and groups[-1][0] == kind:
            groups[-1][1].append(level)
        else:
            groups.append((kind, [level]))
    return ', '.join(f'{_levels(levels)} {kind}' for kind, levels in groups)


def _levels(levels: Iterable[int]) -> str:
    levels = list(levels)
    if len(levels) > 2 and levels == list(range(levels[0], levels[-1] + 1)):
        return f'L{levels[0]}-L{levels[-1]}'
    return ','.join(f'L{level}' for level in levels)
