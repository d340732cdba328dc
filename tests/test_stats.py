"""gpuenv.stats against known values (scipy's, textbook tables) and brute force."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuenv import stats

finite = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False, allow_infinity=False)


def test_quantiles_match_numpy_linear_interpolation():
    xs = [7.0, 1.0, 3.0, 5.0]
    assert stats.median(xs) == 4.0
    assert stats.quantile(xs, 0.25) == pytest.approx(2.5)  # numpy.percentile(xs, 25)
    assert stats.quantile(xs, 0.75) == pytest.approx(5.5)
    assert stats.iqr(xs) == pytest.approx(3.0)
    assert stats.quantile([2.0], 0.9) == 2.0


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        stats.median([])
    with pytest.raises(ValueError):
        stats.median([1.0, math.nan])
    with pytest.raises(ValueError):
        stats.quantile([1.0], 1.5)


@pytest.mark.parametrize(
    "n, ranks, coverage",
    [
        (5, (1, 5), 0.9375),  # too few for 95%: [min, max] with its real coverage
        (6, (1, 6), 0.96875),
        (10, (2, 9), 0.978515625),  # textbook table: ranks 2 and 9
        (20, (6, 15), 1 - 2 * 0.020694732666015625),  # binom.cdf(5, 20, .5) from scipy
    ],
)
def test_median_ci_ranks_known_values(n, ranks, coverage):
    lo, hi, cov = stats.median_ci_ranks(n)
    assert (lo, hi) == ranks
    assert cov == pytest.approx(coverage)


def test_median_ci_ranks_normal_approximation_joins_exact():
    exact = stats.median_ci_ranks(400)
    approx = stats.median_ci_ranks(401)
    assert abs(exact[0] - approx[0]) <= 1
    assert approx[2] >= 0.95


@given(st.integers(min_value=6, max_value=2000))
def test_median_ci_covers_at_least_the_confidence(n):
    lo, hi, cov = stats.median_ci_ranks(n, 0.95)
    assert 1 <= lo <= (n + 1) // 2 <= hi <= n
    assert lo + hi == n + 1
    assert cov >= 0.95 - 1e-3


def test_median_ci_coverage_by_simulation():
    rng = random.Random(1)
    hits = 0
    trials = 400
    for _ in range(trials):
        xs = [rng.lognormvariate(0, 0.5) for _ in range(30)]  # true median 1.0
        lo, hi = stats.median_ci(xs)
        hits += lo <= 1.0 <= hi
    assert hits / trials >= 0.92


def test_mann_whitney_matches_scipy_asymptotic():
    # scipy.stats.mannwhitneyu(a, b, method="asymptotic"), scipy 1.x
    r = stats.mann_whitney([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert r.u == 0.0
    assert r.p_value == pytest.approx(0.012185780355344813, rel=1e-9)
    r = stats.mann_whitney([1.1, 2.2, 2.2, 3.3, 5, 5, 7], [2.2, 4, 5, 6, 8, 9, 9, 10])
    assert r.u == 11.0
    assert r.p_value == pytest.approx(0.054224898519599225, rel=1e-9)
    assert stats.mann_whitney([3, 3, 3, 3], [3, 3, 3]).p_value == 1.0


def test_mann_whitney_u_counts_pairs():
    a, b = [1.0, 4.0, 4.0, 9.0], [2.0, 4.0, 5.0]
    pairs = sum((x > y) + 0.5 * (x == y) for x in a for y in b)
    assert stats.mann_whitney(a, b).u == pairs


def test_mann_whitney_approximation_close_to_exact_permutation_p():
    a = [1.02, 1.05, 0.99, 1.07, 1.04, 1.06]
    b = [0.97, 1.00, 0.96, 1.01, 0.98, 1.03]
    pooled = a + b
    u_obs = stats.mann_whitney(a, b).u
    mu = len(a) * len(b) / 2
    extreme = total = 0
    for idx in itertools.combinations(range(len(pooled)), len(a)):
        sa = [pooled[i] for i in idx]
        sb = [pooled[i] for i in range(len(pooled)) if i not in idx]
        u = sum((x > y) + 0.5 * (x == y) for x in sa for y in sb)
        extreme += abs(u - mu) >= abs(u_obs - mu)
        total += 1
    exact_p = extreme / total
    assert stats.mann_whitney(a, b).p_value == pytest.approx(exact_p, abs=0.01)


@given(st.lists(finite, min_size=1, max_size=20), st.lists(finite, min_size=1, max_size=20))
def test_mann_whitney_symmetry(a, b):
    ab, ba = stats.mann_whitney(a, b), stats.mann_whitney(b, a)
    assert ab.u + ba.u == pytest.approx(len(a) * len(b))
    assert ab.p_value == pytest.approx(ba.p_value)
    assert 0.0 <= ab.p_value <= 1.0


def test_mann_kendall_known_value():
    t = stats.mann_kendall(list(range(1, 11)))
    # S = 45, var = 10*9*25/18 = 125, z = 44 / sqrt(125)
    assert t.s == 45
    assert t.z == pytest.approx(44 / math.sqrt(125))
    assert t.p_value == pytest.approx(math.erfc(t.z / math.sqrt(2)))
    assert stats.mann_kendall([2.0, 2.0, 2.0, 2.0]).p_value == 1.0


def test_theil_sen_ignores_an_outlier():
    assert stats.theil_sen_slope([1, 3, 5, 7, 100]) == 2.0
    assert stats.relative_drift([10.0] * 8) == 0.0


def test_is_steady_sees_a_warmup_ramp_and_not_noise():
    rng = random.Random(3)
    ramp = [1.5 - 0.01 * i + rng.gauss(0, 0.002) for i in range(12)]  # 8% drop over the window
    flat = [1.4 + rng.gauss(0, 0.01) for _ in range(12)]  # 0.7% noise, no trend
    creep = [1.4 * (1 + 0.0002 * i) for i in range(30)]  # significant but 0.6% end to end
    assert not stats.is_steady(ramp)
    assert stats.is_steady(flat)
    assert stats.is_steady(creep, rel_tol=0.01)
    assert not stats.is_steady([1.0, 1.0])  # too few to say


def test_summarize_reports_ci_and_spread():
    xs = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.03, 0.97, 1.0, 1.01]
    s = stats.summarize(xs)
    assert s.n == 10
    assert s.median == pytest.approx(1.0)
    assert s.min == 0.97 and s.max == 1.03
    assert (s.ci_lo, s.ci_hi) == (0.98, 1.02)  # ranks 2 and 9
    assert s.rel_ci == pytest.approx(0.02)
    assert not s.high_spread
    assert stats.summarize([1.0, 1.5, 0.7, 1.2, 0.8]).high_spread
    d = s.to_dict()
    assert d["median_s"] == s.median and d["iqr_s"] == pytest.approx(s.iqr)


def test_bootstrap_median_ci_is_deterministic_and_brackets_the_median():
    rng = random.Random(5)
    xs = [rng.gauss(10, 1) for _ in range(50)]
    a = stats.bootstrap_median_ci(xs, n_boot=500, seed=7)
    b = stats.bootstrap_median_ci(xs, n_boot=500, seed=7)
    assert a == b
    assert a[0] <= stats.median(xs) <= a[1]


def test_bootstrap_ratio_ci_finds_a_ten_percent_slowdown():
    rng = random.Random(2)
    a = [rng.gauss(1.0, 0.01) for _ in range(40)]
    b = [rng.gauss(1.1, 0.01) for _ in range(40)]
    lo, hi = stats.bootstrap_ratio_ci(a, b, n_boot=500)
    assert 1.08 < lo < 1.1 < hi < 1.12


class TestStopRule:
    def test_converges_when_ci_is_tight(self):
        rule = stats.StopRule(rel_ci=0.01, budget_s=100, min_reps=10)
        tight = [1.0 + 0.001 * (i % 5) for i in range(10)]
        assert rule.check(tight, elapsed_s=1.0) == "converged"

    def test_keeps_going_while_noisy(self):
        rule = stats.StopRule(rel_ci=0.01, budget_s=100, min_reps=10)
        rng = random.Random(0)
        noisy = [rng.uniform(0.8, 1.2) for _ in range(20)]
        assert rule.check(noisy, elapsed_s=1.0) is None

    def test_budget_is_a_hard_limit(self):
        rule = stats.StopRule(rel_ci=0.01, budget_s=2.0, min_reps=10)
        assert rule.check([1.0, 2.0], elapsed_s=2.5) == "budget"
        assert rule.check([], elapsed_s=2.5) is None  # at least one rep

    def test_max_reps_and_min_reps(self):
        rule = stats.StopRule(rel_ci=0.5, budget_s=100, min_reps=8, max_reps=12)
        assert rule.check([1.0] * 7, elapsed_s=0) is None
        assert rule.check([1.0] * 8, elapsed_s=0) == "converged"
        assert (
            stats.StopRule(rel_ci=0, budget_s=100, min_reps=1, max_reps=12).check([1.0] * 12, 0)
            == "max_reps"
        )

    def test_rejects_nonsense(self):
        with pytest.raises(ValueError):
            stats.StopRule(budget_s=0)
        with pytest.raises(ValueError):
            stats.StopRule(min_reps=10, max_reps=5)

    @settings(max_examples=50)
    @given(st.lists(finite, min_size=1, max_size=60), st.floats(0, 20))
    def test_answers_are_valid(self, times, elapsed):
        reason = stats.StopRule().check(times, elapsed)
        assert reason is None or reason in stats.STOP_REASONS


def test_median_ci_ranks_match_the_binomial_sums_they_stand_for():
    """The ranks come from P(X <= k), X ~ Binomial(n, 1/2), summed as k grows: the same
    ranks and coverage as summing comb(n, i) anew for every k."""
    import math

    from gpuenv.stats.descriptive import _EXACT_BINOMIAL_MAX_N, median_ci_ranks

    for n in range(1, _EXACT_BINOMIAL_MAX_N + 1, 7):
        k, cdf = 0, 0.0
        while (nxt := sum(math.comb(n, i) for i in range(k + 1)) / 2**n) <= 0.025:
            cdf, k = nxt, k + 1
        expected = (1, n, 1.0 - 2.0 * 0.5**n) if k == 0 else (k, n - k + 1, 1.0 - 2.0 * cdf)
        assert median_ci_ranks(n, 0.95) == expected


def test_levels_names_the_shape_of_many_reps() -> None:
    from gpuenv.stats import levels

    rng = random.Random(5)
    flat = [1.0 + rng.gauss(0, 0.01) for _ in range(10_000)]  # a tiny kernel's call, or more
    assert levels(flat) is None
    step = flat[:6000] + [x * 1.05 for x in flat[6000:]]
    found = levels(step)
    assert found is not None and found.shape == "step" and found.at == 6000
    assert levels([1.0] * 9 + [2.0]) is None  # too few reps to say
    assert levels([1.0] * 40) is None  # constant
