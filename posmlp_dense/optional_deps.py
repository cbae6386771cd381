"""Which optional frameworks (mmengine, mmdet, mmseg) are installed."""
from __future__ import annotations

import importlib.util


def is_installed(name: str) -> bool:
    """True if ``name`` can be imported, without importing it.

    A package that an import hook hides, or a namespace left without a spec,
    counts as not installed.
    """
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
