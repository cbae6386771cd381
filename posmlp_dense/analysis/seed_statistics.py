"""How far per-seed scores pin a gate down, and whether two gates differ by
more than the seeds' noise.

A gate's interval is Student's t interval on the mean of its seeds' top-1.
Two gates are compared seed by seed (a paired t-test): seed s of one gate
and seed s of the other share the data order and the recipe's seed, so the
differences ``a[s] - b[s]`` carry less of the noise that both runs share,
and their mean, its t interval and the two-sided p-value answer "is the
gap larger than the noise?". A difference is called larger than the noise
when its interval excludes 0 (equivalently, p below 1 - level).
"""
from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

from .student_t import critical_value, two_sided_p

__all__ = ['LEVEL', 'mean_interval', 'paired_test']

#: The confidence level of every interval the ablation reports.
LEVEL = 0.95


def _floats(values: Sequence[float], what: str) -> list:
    values = [float(v) for v in values]
    if not values:
        raise ValueError(f'{what}: no values')
    if any(math.isnan(v) for v in values):
        raise ValueError(f'{what}: a value is NaN: {values}')
    return values


def _interval(values: list, level: float) -> dict:
    """Mean, sample std and the t interval of the mean (None with one
    value: a single seed says nothing about the noise)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return dict(n=n, mean=mean, std=None, half_width=None, low=None,
                    high=None, level=level)
    std = statistics.stdev(values)
    half = critical_value(level, n - 1) * std / math.sqrt(n)
    return dict(n=n, mean=mean, std=std, half_width=half, low=mean - half,
                high=mean + half, level=level)


def mean_interval(values: Sequence[float], level: float = LEVEL) -> dict:
    """The ``level`` Student-t interval of the mean of ``values``: a dict
    of n, mean, std, half_width, low, high, level (the last four None for
    a single value)."""
    return _interval(_floats(values, 'mean_interval'), level)


def paired_test(a: Sequence[float], b: Sequence[float],
                level: float = LEVEL) -> dict:
    """Paired t-test of ``a`` against ``b`` (same length, entry s of each
    from the same seed): the mean difference a - b, its std and ``level``
    interval, t, the two-sided p-value, and ``larger_than_noise`` (the
    interval excludes 0; None with one pair). With identical differences
    (std 0) the p-value is 0 for a nonzero mean and 1 for a zero one, and
    t is None (it is infinite or undefined)."""
    a, b = _floats(a, 'paired_test a'), _floats(b, 'paired_test b')
    if len(a) != len(b):
        raise ValueError(f'paired_test needs one value per seed on both '
                         f'sides, got {len(a)} and {len(b)}')
    out = _interval([x - y for x, y in zip(a, b)], level)
    n, mean, std = out['n'], out['mean'], out['std']
    if n < 2:
        out.update(t=None, df=0, p=None, larger_than_noise=None)
        return out
    if std == 0.0:
        t: Optional[float] = None
        p = 1.0 if mean == 0.0 else 0.0
    else:
        t = mean / (std / math.sqrt(n))
        p = two_sided_p(t, n - 1)
    out.update(t=t, df=n - 1, p=p,
               larger_than_noise=not out['low'] <= 0.0 <= out['high'])
    return out
