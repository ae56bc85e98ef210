"""Percentile intervals by order statistics and LoadGen's early-stopping estimate, against known distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from servegate.capacity.bench.percentiles import (
    bound_holds,
    conservative_estimate,
    early_stopping_floor,
    estimate,
    interval_ranks,
    lower_bound,
    overlatency_allowed,
    requests_to_pass,
)


@pytest.mark.parametrize(("q", "true_quantile"), [(50, 0.0), (95, 1.6448536269514722), (99, 2.3263478740408408)])
def test_the_95_percent_interval_covers_the_true_percentile_in_95_percent_of_draws(
    q: float, true_quantile: float
) -> None:
    """1,000 samples of 1,000 lognormal latencies: the interval of pN holds the true pN about 95% of the time."""
    rng = np.random.default_rng(24)
    samples = np.sort(rng.lognormal(0.0, 1.0, size=(1000, 1000)), axis=1)
    truth = math.exp(true_quantile)  # lognormal(0, 1): the quantile is exp of the normal's
    low, high = interval_ranks(1000, q)  # type: ignore[misc]
    covered = (samples[:, low - 1] <= truth) & (truth <= samples[:, high - 1])
    # the ranks are whole numbers, so the exact coverage is a little above 95%: B(high - 1) - B(low - 1)
    exact = stats.binom.cdf(high - 1, 1000, q / 100) - stats.binom.cdf(low - 1, 1000, q / 100)
    assert 0.95 <= exact <= 0.98
    assert abs(covered.mean() - exact) <= 0.02, (covered.mean(), exact)  # 1,000 draws: sd <= 0.007


def test_an_interval_that_cannot_be_formed_says_n_too_small() -> None:
    e = estimate(np.arange(100.0), 99)
    assert e.value == pytest.approx(98.01) and e.ci is None
    assert e.ci_reason == "n too small: a 95% interval of p99 needs at least 368 samples (got 100)"
    assert e.conservative is None and "662" in (e.conservative_reason or "")
    fields = e.fields()
    assert fields["p99_ci"] is None and fields["p99_conservative"] is None and fields["p99_floor"] == 662
    assert estimate([], 50).ci_reason == "no samples"


def test_early_stopping_floors_are_loadgens() -> None:
    """LoadGen at 99% confidence: a p90 estimate needs 64 queries, p95 130, p99 662; a bound 459 with none over."""
    assert [early_stopping_floor(q) for q in (90, 95, 99)] == [64, 130, 662]
    assert overlatency_allowed(458, 99) == -1 and overlatency_allowed(459, 99) == 0
    assert requests_to_pass(100, 0, 99) == 359 and requests_to_pass(500, 0, 99) == 0
    assert bound_holds(459, 0, 99) and not bound_holds(459, 1, 99)


def _hand_t(n: int, q: float) -> int:
    """The most samples over the percentile that n can hold at 99% confidence, from binomial terms summed by hand."""
    over = 1 - q / 100
    cdf, t = 0.0, -1
    for k in range(n + 1):
        cdf += math.comb(n, k) * over**k * (1 - over) ** (n - k)
        if cdf >= 0.01:
            return t
        t = k
    return t


@pytest.mark.parametrize(("n", "q"), [(64, 90), (63, 90), (200, 90), (1000, 90), (700, 99), (2000, 99), (130, 95)])
def test_the_conservative_estimate_is_the_order_statistic_computed_by_hand(n: int, q: float) -> None:
    values = np.sort(np.random.default_rng(n).exponential(10.0, size=n))
    t = _hand_t(n, q)
    assert overlatency_allowed(n, q) == t
    expected = float(values[n - t]) if t >= 1 else None  # the t-th largest: discard the t - 1 above it
    assert conservative_estimate(values, q) == expected


def test_the_conservative_p90_of_64_samples_is_their_maximum_and_63_have_none() -> None:
    assert conservative_estimate(np.arange(1.0, 65.0), 90) == 64.0
    assert conservative_estimate(np.arange(1.0, 64.0), 90) is None


def test_a_lower_bound_exists_where_the_two_sided_interval_does_not() -> None:
    values = np.arange(1.0, 101.0)
    assert interval_ranks(100, 99) is None
    low = lower_bound(values, 99)
    assert low is not None and 90 <= low <= 99
