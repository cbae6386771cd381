"""The error for a detector, or a setting of one, that is not exported.

The deploy graphs are written for particular mmdet modules and test-time
settings; anything else would compute something other than mmdet's
``predict``, so it is refused by name before any export work.
"""
from __future__ import annotations

from typing import Iterable


class UnsupportedDetectorError(ValueError):
    """A detector module or setting that the ONNX export does not cover."""


def require_type(module, expected: Iterable[type], where: str, why: str):
    """Raise unless ``module`` is exactly one of ``expected`` (a subclass
    may compute something else)."""
    expected = tuple(expected)
    if type(module) not in expected:
        names = ' or '.join(cls.__name__ for cls in expected)
        raise UnsupportedDetectorError(
            f'{where} is {type(module).__name__}; the detector export '
            f'supports {names} there ({why})')


def require_keys(cfg, allowed: Iterable[str], where: str):
    """Raise for a test_cfg key that the deploy graph does not implement."""
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        raise UnsupportedDetectorError(
            f'{where} has {", ".join(unknown)}, which the detector export '
            f'does not implement (it knows {", ".join(sorted(allowed))})')
