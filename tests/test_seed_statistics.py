"""The gate ablation's statistics against values worked out by hand or read
from printed t tables: Student's t tail and critical value
(posmlp_dense.analysis.student_t), the interval of a mean and the paired
t-test (posmlp_dense.analysis.seed_statistics)."""
from __future__ import annotations

import math

import pytest

from posmlp_dense.analysis.seed_statistics import mean_interval, paired_test
from posmlp_dense.analysis.student_t import critical_value, two_sided_p


# t_{0.975, df} as printed in t tables (three decimals)
@pytest.mark.parametrize('df, table', [
    (1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571),
    (9, 2.262), (10, 2.228), (30, 2.042), (1000, 1.962)])
def test_critical_value_matches_the_t_table(df, table):
    assert critical_value(0.95, df) == pytest.approx(table, abs=5e-4)


def test_critical_value_at_other_levels():
    # t tables: t_{0.95, 4} = 2.132 (90% interval), t_{0.995, 7} = 3.499
    assert critical_value(0.90, 4) == pytest.approx(2.132, abs=5e-4)
    assert critical_value(0.99, 7) == pytest.approx(3.499, abs=5e-4)


@pytest.mark.parametrize('t, df, p', [
    # df 1 (Cauchy): p = 1 - 2 atan(t) / pi
    (1.0, 1, 0.5),
    (3.0, 1, 1 - 2 * math.atan(3.0) / math.pi),
    # df 2: p = 1 - t / sqrt(t^2 + 2)
    (2.0, 2, 1 - 2 / math.sqrt(6)),
    (-2.0, 2, 1 - 2 / math.sqrt(6)),
    # df 3: p = 1 - (2/pi) (atan(u) + u / (1 + u^2)), u = t / sqrt(3)
    (1.5, 3, 1 - 2 / math.pi * (math.atan(1.5 / math.sqrt(3)) +
                                (1.5 / math.sqrt(3)) / (1 + 0.75))),
    (0.0, 5, 1.0),
])
def test_two_sided_p_closed_forms(t, df, p):
    assert two_sided_p(t, df) == pytest.approx(p, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize('df', [1, 2, 3, 4, 7, 12])
def test_p_at_the_critical_value_is_one_minus_the_level(df):
    assert two_sided_p(critical_value(0.95, df), df) == pytest.approx(
        0.05, abs=1e-9)


@pytest.mark.parametrize('df', [0, -1, 2.5, True, '3'])
def test_degrees_of_freedom_must_be_whole(df):
    with pytest.raises(ValueError, match='degrees of freedom'):
        critical_value(0.95, df)
    with pytest.raises(ValueError, match='degrees of freedom'):
        two_sided_p(1.0, df)


@pytest.mark.parametrize('level', [0.0, 1.0, 95])
def test_level_must_be_a_probability(level):
    with pytest.raises(ValueError, match='level'):
        critical_value(level, 3)


def test_mean_interval_by_hand():
    # mean 2, std 1, half-width t_{0.975,2} / sqrt(3) = 4.3027 / 1.7321
    out = mean_interval([1.0, 2.0, 3.0])
    half = 4.302653 / math.sqrt(3)
    assert out['mean'] == 2.0 and out['std'] == 1.0 and out['n'] == 3
    assert out['half_width'] == pytest.approx(half, rel=1e-6)
    assert (out['low'], out['high']) == pytest.approx((2 - half, 2 + half),
                                                      rel=1e-6)
    assert out['level'] == 0.95


def test_one_seed_has_no_interval():
    out = mean_interval([40.0])
    assert out['mean'] == 40.0
    assert out['low'] is None and out['high'] is None and out['std'] is None


def test_paired_test_by_hand():
    # differences 2, 3, 4: mean 3, std 1, t = 3 sqrt(3), df 2,
    # p = 1 - t / sqrt(t^2 + 2)
    out = paired_test([3.0, 5.0, 7.0], [1.0, 2.0, 3.0])
    t = 3 * math.sqrt(3)
    half = 4.302653 / math.sqrt(3)
    assert out['mean'] == 3.0 and out['std'] == 1.0 and out['df'] == 2
    assert out['t'] == pytest.approx(t)
    assert out['p'] == pytest.approx(1 - t / math.sqrt(t * t + 2))
    assert (out['low'], out['high']) == pytest.approx((3 - half, 3 + half),
                                                      rel=1e-6)
    assert out['larger_than_noise'] is True


def test_the_test_is_paired_seed_against_seed():
    """b is a spread out over seeds and a sits one point above it at every
    seed: the paired difference is exactly 1 with no noise. An unpaired
    comparison would drown it in the seeds' spread."""
    b = [30.0, 50.0, 70.0, 45.0]
    a = [v + 1.0 for v in b]
    out = paired_test(a, b)
    assert out['mean'] == 1.0 and out['std'] == 0.0
    assert out['p'] == 0.0 and out['t'] is None
    assert out['larger_than_noise'] is True
    # shuffled pairing: the same values, no longer seed against seed
    shuffled = paired_test(a, b[::-1])
    assert shuffled['larger_than_noise'] is False


def test_a_gap_within_the_noise():
    out = paired_test([50.0, 60.0, 40.0], [48.0, 52.0, 47.0])
    assert out['low'] < 0 < out['high']
    assert out['larger_than_noise'] is False and out['p'] > 0.05


def test_no_difference_at_all():
    out = paired_test([50.0, 60.0], [50.0, 60.0])
    assert out['mean'] == 0.0 and out['p'] == 1.0
    assert out['larger_than_noise'] is False


def test_one_pair_gives_no_verdict():
    out = paired_test([50.0], [40.0])
    assert out['mean'] == 10.0
    assert out['p'] is None and out['larger_than_noise'] is None


@pytest.mark.parametrize('a, b, message', [
    ([1.0, 2.0], [1.0], 'one value per seed'),
    ([], [], 'no values'),
    ([1.0, float('nan')], [1.0, 2.0], 'NaN'),
])
def test_bad_input_is_named(a, b, message):
    with pytest.raises(ValueError, match=message):
        paired_test(a, b)
