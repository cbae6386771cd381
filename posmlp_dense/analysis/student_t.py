"""Student's t distribution for whole degrees of freedom: the two-sided
tail probability and the critical value of a confidence interval.

The gate ablation needs only these two numbers, and only for whole degrees
of freedom (seeds - 1), where the distribution has a closed form (a finite
sum of powers of cos(theta), theta = atan(t / sqrt(df)); Abramowitz and
Stegun 26.7.3-4). Computing it here keeps scipy, a large package the
backbone does not otherwise need, out of the requirements.
"""
from __future__ import annotations

import math

__all__ = ['two_sided_p', 'critical_value']


def _check_df(df) -> int:
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f'degrees of freedom must be a whole number of at '
                         f'least 1, got {df!r}')
    return df


def _central_probability(t: float, df: int) -> float:
    """P(|T| <= t) for t >= 0, T Student-t with ``df`` degrees of freedom."""
    if math.isinf(t):
        return 1.0
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    # the series' terms: each the last times c2 (k - 1) / k, k stepping by 2
    if df % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 c2 + 2*4/(3*5) c2^2..))
        if df == 1:
            return 2.0 * theta / math.pi
        term, total = 1.0, 1.0
        for k in range(3, df - 1, 2):
            term *= c2 * (k - 1) / k
            total += term
        return 2.0 / math.pi * (theta + math.sin(theta) * math.cos(theta)
                                * total)
    # even: sin (1 + 1/2 c2 + 1*3/(2*4) c2^2 + ...)
    term, total = 1.0, 1.0
    for k in range(2, df - 1, 2):
        term *= c2 * (k - 1) / k
        total += term
    return math.sin(theta) * total


def two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|): the p-value of a two-sided t-test."""
    df = _check_df(df)
    if math.isnan(t):
        raise ValueError('t is NaN')
    return min(1.0, max(0.0, 1.0 - _central_probability(abs(t), df)))


def critical_value(level: float, df: int) -> float:
    """The t with P(|T| <= t) = ``level`` (e.g. 0.95): the half-width of a
    ``level`` confidence interval in standard errors."""
    df = _check_df(df)
    if not 0.0 < level < 1.0:
        raise ValueError(f'level must be between 0 and 1, got {level!r}')
    lo, hi = 0.0, 1.0
    while _central_probability(hi, df) < level:
        hi *= 2.0
    # bisection: P(|T| <= t) rises with t; 200 halvings reach the float's
    # resolution long before they run out
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _central_probability(mid, df) < level:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
