"""The gate statistics on cases worked out by hand (closed forms and binomial sums, not the code's own scipy calls)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servegate.gates.quality.statistics import (
    boundary_check,
    exact_n_min,
    next_token_divergence,
    paired_noninferiority,
    score_interval,
)


def _binomial_upper(k: int, n: int, alpha: float) -> float:
    """Clopper-Pearson upper bound by bisection on the binomial sum P(X <= k; n, q) = alpha."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        q = (lo + hi) / 2
        tail = sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k + 1))
        lo, hi = (q, hi) if tail > alpha else (lo, q)
    return (lo + hi) / 2


def test_identical_outputs_give_the_closed_form_bound_and_pass_a_wide_enough_margin() -> None:
    scores = [1] * 150 + [0] * 50
    result = paired_noninferiority(scores, scores, margin=0.02, confidence=0.95)
    # no changed item: lower = -(1 - (alpha/2) ** (1/n)) = -(1 - 0.025 ** (1/200))
    assert result.lower == pytest.approx(-(1 - 0.025 ** (1 / 200)), abs=1e-9)
    assert result.lower == pytest.approx(-0.018275, abs=1e-6)
    assert (result.n, result.baseline_score, result.candidate_score, result.difference) == (200, 0.75, 0.75, 0.0)
    assert (result.regressions, result.improvements) == (0, 0)
    assert result.verdict == "pass"


def test_a_suite_too_small_for_the_margin_warns_and_says_how_many_items_are_needed() -> None:
    scores = [1] * 200
    result = paired_noninferiority(scores, scores, margin=0.01)
    # n_min = floor(ln 0.025 / ln 0.99) + 1 = floor(367.04) + 1
    assert result.n_min == 368
    assert result.verdict == "warn"
    assert "too small" in result.reason and "368" in result.reason


def test_n_min_closed_form() -> None:
    assert exact_n_min(0.02, 0.95) == 183  # ln(0.025) / ln(0.98) = 182.6
    assert exact_n_min(0.05, 0.95) == 72  # ln(0.025) / ln(0.95) = 71.9
    assert exact_n_min(0.0, 0.95) is None


def test_one_regression_in_ten_matches_the_binomial_sum() -> None:
    base = [1] * 10
    cand = [0] + [1] * 9
    result = paired_noninferiority(base, cand, margin=0.05)
    # b=1, c=0: theta_L = 0, so lower = -q_U with q_U the 97.5% upper bound of 1 changed item in 10
    q_upper = _binomial_upper(1, 10, 0.025)
    assert q_upper == pytest.approx(0.4450, abs=1e-3)
    assert result.lower == pytest.approx(-q_upper, abs=1e-6)
    assert result.difference == pytest.approx(-0.1)
    assert (result.regressions, result.improvements) == (1, 0)
    assert result.verdict == "warn"  # n=10 < 72: cannot decide a 5-point margin


def test_every_item_regressing_is_shown_inferior() -> None:
    result = paired_noninferiority([1] * 10, [0] * 10, margin=0.05)
    # q_L = 0.025 ** (1/10) = 0.6915, theta_U = 1 - 0.025 ** (1/10) = 0.3085: upper = 0.6915 * (2*0.3085 - 1)
    q_lower = 0.025**0.1
    assert result.upper == pytest.approx(q_lower * (2 * (1 - q_lower) - 1), abs=1e-6)
    assert result.lower == pytest.approx(-1.0)
    assert result.verdict == "fail" and result.reason.startswith("inferior")


def test_regressions_beyond_the_margin_fail_on_a_large_suite() -> None:
    base = [1] * 400
    cand = [0] * 40 + [1] * 360  # a 10-point drop, n far above n_min
    result = paired_noninferiority(base, cand, margin=0.02)
    assert result.verdict == "fail"
    assert result.difference == pytest.approx(-0.1)


def test_improvements_offset_regressions() -> None:
    base = [1] * 5 + [0] * 5 + [1] * 490
    cand = [0] * 5 + [1] * 5 + [1] * 490
    result = paired_noninferiority(base, cand, margin=0.03)
    assert result.difference == 0.0
    assert result.verdict == "pass"
    assert -0.03 < result.lower < 0 < result.upper


def test_bootstrap_with_a_constant_difference_has_a_point_interval() -> None:
    base = np.linspace(0.1, 0.5, 50)
    result = paired_noninferiority(base, base + 0.1, margin=0.05)
    assert result.method.startswith("paired bootstrap")
    assert result.lower == pytest.approx(0.1) and result.upper == pytest.approx(0.1)
    assert result.verdict == "pass"


def test_bootstrap_bound_is_close_to_the_normal_bound_on_a_large_sample() -> None:
    rng = np.random.default_rng(3)
    base = rng.uniform(0, 1, 2000)
    cand = base + rng.normal(-0.01, 0.1, 2000)
    result = paired_noninferiority(base, cand, margin=0.05)
    diffs = cand - base
    normal_lower = diffs.mean() - 1.6449 * diffs.std(ddof=1) / math.sqrt(len(diffs))
    assert result.lower == pytest.approx(normal_lower, abs=0.002)
    assert result.verdict == "pass"


def test_unequal_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="equal-length"):
        paired_noninferiority([1, 0], [1], margin=0.1)


@pytest.mark.parametrize(
    ("correct", "verdict"),
    [(70, "pass"), (45, "fail"), (55, "warn")],  # 55/100: lower bound 0.463 < 0.5 <= 0.55
)
def test_boundary_check(correct: int, verdict: str) -> None:
    result = boundary_check([1] * correct + [0] * (100 - correct), 0.5, metric="exact_match")
    assert result.verdict == verdict
    assert result.score == correct / 100


def test_next_token_divergence_by_hand() -> None:
    base = [[0.0, 0.0], [2.0, 0.0]]
    cand = [[math.log(3.0), 0.0], [0.0, 2.0]]
    result = next_token_divergence(base, cand)
    # position 1: p=(.5,.5), q=(.75,.25): .5 ln(.5/.75) + .5 ln(.5/.25) = 0.143841
    # position 2: p and q mirrored: (p1 - p2) * ln(p1/p2) = 0.761594 * 2 = 1.523188
    assert result.mean_kl == pytest.approx((0.143841 + 1.523188) / 2, abs=1e-5)
    assert result.max_kl == pytest.approx(1.523188, abs=1e-5)
    assert result.token_agreement == 0.5
    assert result.positions == 2


def test_next_token_divergence_is_the_same_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from servegate.gates.quality import statistics

    rng = np.random.default_rng(1)
    base, cand = torch.tensor(rng.normal(size=(9, 5))), torch.tensor(rng.normal(size=(9, 5)))
    whole = next_token_divergence(base, cand)
    monkeypatch.setattr(statistics, "DIVERGENCE_ROWS", 2)  # 5 passes of at most 2 positions
    assert next_token_divergence(base, cand) == pytest.approx(whole)


def test_next_token_divergence_agrees_with_the_zoo_metric() -> None:
    from servegate.gates.suites.evaluation import _metric

    rng = np.random.default_rng(0)
    base, cand = rng.normal(size=(20, 7)), rng.normal(size=(20, 7))
    ours = next_token_divergence(base, cand)
    zoo = _metric("mean_kl")._compute(predictions=cand.tolist(), references=base.tolist())
    assert ours.mean_kl == pytest.approx(zoo["mean_kl"], rel=1e-9)


def test_score_interval_is_clopper_pearson_for_pass_fail_scores() -> None:
    none_right = score_interval([0] * 10)
    assert none_right.low == 0.0
    assert none_right.high == pytest.approx(1 - 0.025**0.1, abs=1e-9)
    assert score_interval([1, 1, 0, 1]).score == 0.75
