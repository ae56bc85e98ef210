"""Paired statistics for quality gates: non-inferiority on the same items, boundaries, and next-token divergence.

A candidate is *non-inferior* on a metric when the lower confidence bound of (candidate - baseline),
computed on the same items, is above `-margin`. For pass/fail (0/1) scores the bound is exact: write
the paired outcomes as b regressions (baseline right, candidate wrong) and c improvements among n
items; the difference is q * (2 theta - 1) with q = P(item changes) and theta = P(improvement | change).
One-sided Clopper-Pearson bounds for q (from m = b + c out of n) and for theta (from c out of m), each at
level 1 - alpha/2, cover both parameters together with probability >= 1 - alpha (Bonferroni), so the
smallest difference over that region is a lower bound with guaranteed coverage. It is conservative, never
degenerate: identical outputs on n items still give -(1 - (alpha/2) ** (1/n)), which is why a small suite
cannot show non-inferiority at a small margin. Other scores use a paired bootstrap (scipy.stats.bootstrap).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats

from servegate.contracts.report.quality import BoundaryCheck

Method = Literal["auto", "exact", "bootstrap"]


@dataclass(frozen=True)
class PairedComparison:
    """The outcome of a paired non-inferiority test of one metric on one suite."""

    metric: str
    n: int
    """Items compared (the same items for both)."""
    baseline_score: float
    candidate_score: float
    difference: float
    """candidate_score - baseline_score."""
    lower: float
    """One-sided lower confidence bound of the difference at `confidence` (the decision statistic)."""
    upper: float
    """One-sided upper confidence bound of the difference at `confidence`."""
    confidence: float
    margin: float
    method: str
    regressions: int | None
    """Items right for the baseline and wrong for the candidate (0/1 metrics only)."""
    improvements: int | None
    """Items wrong for the baseline and right for the candidate (0/1 metrics only)."""
    n_min: int | None
    """Smallest n at which a candidate identical to the baseline could show non-inferiority at this margin."""
    verdict: Literal["pass", "fail", "warn"]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form with rounded numbers."""
        out = asdict(self)
        for key in ("baseline_score", "candidate_score", "difference", "lower", "upper"):
            out[key] = round(out[key], 6)
        return out


def _is_binary(values: np.ndarray) -> bool:
    return bool(np.all((values == 0) | (values == 1)))


def cp_lower(successes: int, trials: int, level: float) -> float:
    """One-sided Clopper-Pearson lower bound for a binomial proportion at confidence `level`."""
    if successes <= 0 or trials <= 0:
        return 0.0
    return float(stats.beta.ppf(1.0 - level, successes, trials - successes + 1))


def cp_upper(successes: int, trials: int, level: float) -> float:
    """One-sided Clopper-Pearson upper bound for a binomial proportion at confidence `level`."""
    if trials <= 0 or successes >= trials:
        return 1.0
    return float(stats.beta.ppf(level, successes + 1, trials - successes))


def exact_paired_bounds(regressions: int, improvements: int, n: int, confidence: float) -> tuple[float, float]:
    """One-sided lower and upper bounds of (candidate - baseline) for paired 0/1 outcomes (see module doc)."""
    alpha = 1.0 - confidence
    level = 1.0 - alpha / 2.0  # Bonferroni split between q and theta
    m = regressions + improvements
    q_lo, q_hi = cp_lower(m, n, level), cp_upper(m, n, level)
    theta_lo, theta_hi = cp_lower(improvements, m, level), cp_upper(improvements, m, level)
    if m == 0:
        theta_lo, theta_hi = 0.0, 1.0  # theta is not identified without a changed item
    # q * (2 theta - 1) is smallest at the largest q when the sign is negative, at the smallest q otherwise.
    lower = (q_hi if theta_lo < 0.5 else q_lo) * (2.0 * theta_lo - 1.0)
    upper = (q_hi if theta_hi > 0.5 else q_lo) * (2.0 * theta_hi - 1.0)
    return lower, upper


def exact_n_min(margin: float, confidence: float) -> int | None:
    """Smallest n at which identical outputs give a lower bound above -margin (None: never, margin 0)."""
    if margin <= 0:
        return None
    if margin >= 1:
        return 1
    alpha_half = (1.0 - confidence) / 2.0
    # identical outputs: lower = -(1 - alpha_half ** (1/n)) > -margin  <=>  n > ln(alpha_half) / ln(1 - margin)
    return math.floor(math.log(alpha_half) / math.log(1.0 - margin)) + 1


def _bootstrap_bounds(base: np.ndarray, cand: np.ndarray, confidence: float, seed: int) -> tuple[float, float]:
    diffs = cand - base
    if np.all(diffs == diffs[0]):
        return float(diffs[0]), float(diffs[0])  # every resample has the same mean

    def mean_difference(b: np.ndarray, c: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean(c - b, axis=axis)

    # A two-sided interval at 2*confidence - 1 has one-sided bounds at `confidence` on each side.
    result = stats.bootstrap(
        (base, cand),
        mean_difference,
        paired=True,
        vectorized=True,
        confidence_level=2.0 * confidence - 1.0,
        n_resamples=4999,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def paired_noninferiority(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    margin: float,
    confidence: float = 0.95,
    metric: str = "score",
    method: Method = "auto",
    seed: int = 0,
) -> PairedComparison:
    """Test candidate >= baseline - margin on paired per-item scores; pass, fail, or warn when underpowered.

    pass: lower bound > -margin. fail: upper bound < -margin (inferiority shown), or the test is
    inconclusive although the suite is large enough. warn: inconclusive because the suite is too small
    for this margin (n < n_min) — more items are needed to decide.
    """
    base = np.asarray(baseline, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    if base.shape != cand.shape or base.ndim != 1:
        raise ValueError(f"paired scores need two equal-length lists (got {base.shape} and {cand.shape})")
    n = int(base.size)
    if n == 0:
        return PairedComparison(
            metric, 0, 0.0, 0.0, 0.0, -1.0, 1.0, confidence, margin, "none", None, None, None, "warn", "no items"
        )
    binary = _is_binary(base) and _is_binary(cand)
    chosen = ("exact" if binary else "bootstrap") if method == "auto" else method
    if chosen == "exact" and not binary:
        raise ValueError("the exact method needs 0/1 scores; use method='bootstrap' for other metrics")
    regressions = improvements = None
    if binary:
        regressions = int(np.sum((base == 1) & (cand == 0)))
        improvements = int(np.sum((base == 0) & (cand == 1)))
    if chosen == "exact":
        assert regressions is not None and improvements is not None
        lower, upper = exact_paired_bounds(regressions, improvements, n, confidence)
        n_min = exact_n_min(margin, confidence)
        label = "exact paired (Clopper-Pearson, Bonferroni)"
    else:
        lower, upper = _bootstrap_bounds(base, cand, confidence, seed)
        sd = float(np.std(cand - base, ddof=1)) if n > 1 else 0.0
        z = float(stats.norm.ppf(confidence))
        n_min = max(2, math.ceil((z * sd / margin) ** 2)) if margin > 0 and sd > 0 else (2 if margin > 0 else None)
        label = "paired bootstrap (percentile)"
    b_score, c_score = float(base.mean()), float(cand.mean())
    diff = c_score - b_score
    bound = f"lower bound {lower:+.4f} at {confidence:.0%}"
    verdict: Literal["pass", "fail", "warn"]
    if lower > -margin:
        verdict, reason = "pass", f"non-inferior: {bound} > -{margin:g}"
    elif upper < -margin:
        verdict, reason = "fail", f"inferior: difference {diff:+.4f}, upper bound {upper:+.4f} < -{margin:g}"
    elif n_min is None or n < n_min:
        need = "no n suffices at margin 0" if n_min is None else f"needs >= {n_min}"
        verdict, reason = "warn", f"suite too small to detect a {margin:g} margin: n={n} ({need}); {bound}"
    else:
        verdict, reason = "fail", f"non-inferiority not shown: {bound} <= -{margin:g} (difference {diff:+.4f})"
    return PairedComparison(
        metric, n, b_score, c_score, diff, lower, upper, confidence, margin, label,
        regressions, improvements, n_min, verdict, reason,
    )  # fmt: skip


def boundary_check(
    scores: Sequence[float], boundary: float, *, confidence: float = 0.95, metric: str = "score"
) -> BoundaryCheck:
    """pass when the lower bound of the score is >= boundary, fail when the score itself is below, else warn."""
    values = np.asarray(scores, dtype=np.float64)
    n = int(values.size)
    score = float(values.mean()) if n else 0.0
    if n == 0:
        return BoundaryCheck(
            metric=metric,
            n=0,
            score=0.0,
            lower=0.0,
            boundary=boundary,
            confidence=confidence,
            verdict="warn",
            reason="no items",
        )
    if _is_binary(values):
        lower = cp_lower(int(values.sum()), n, confidence)
    else:
        sem = float(np.std(values, ddof=1) / math.sqrt(n)) if n > 1 else 0.0
        lower = score - float(stats.norm.ppf(confidence)) * sem
    verdict: Literal["pass", "fail", "warn"]
    if lower >= boundary:
        verdict, reason = "pass", f"{metric} {score:.4f} (lower bound {lower:.4f}) >= boundary {boundary:g}"
    elif score < boundary:
        verdict, reason = "fail", f"{metric} {score:.4f} is below the declared boundary {boundary:g}"
    else:
        verdict, reason = "warn", f"{metric} {score:.4f} but lower bound {lower:.4f} < boundary {boundary:g} at n={n}"
    return BoundaryCheck(
        metric=metric,
        n=n,
        score=score,
        lower=lower,
        boundary=boundary,
        confidence=confidence,
        verdict=verdict,
        reason=reason,
    )


@dataclass(frozen=True)
class NextTokenDivergence:
    """How two models' next-token distributions differ at the same positions."""

    positions: int
    token_agreement: float
    """Share of positions where both models' most likely next token is the same."""
    mean_kl: float
    """Mean KL(baseline || candidate) in nats."""
    max_kl: float

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


DIVERGENCE_ROWS = 256
"""Positions whose KL is computed at once, in float64: 256 x a 49,152-token vocabulary is 96 MiB a tensor, where
all 3,749 positions of a 64-item suite at once took over 10 GiB."""


def next_token_divergence(baseline_logits: Any, candidate_logits: Any) -> NextTokenDivergence:
    """Top-1 agreement and KL(baseline || candidate) from logits of shape [positions, vocab], DIVERGENCE_ROWS
    positions at a time."""
    import torch

    def tensor(logits: Any) -> Any:  # a tensor as it is (float32 logits stay small); lists and arrays in float64
        return logits if isinstance(logits, torch.Tensor) else torch.as_tensor(logits, dtype=torch.float64)

    base_all, cand_all = tensor(baseline_logits), tensor(candidate_logits)
    if base_all.shape != cand_all.shape or base_all.ndim != 2:
        raise ValueError(
            f"logits must both be [positions, vocab] (got {tuple(base_all.shape)} and {tuple(cand_all.shape)})"
        )
    if base_all.shape[0] == 0:
        return NextTokenDivergence(0, 1.0, 0.0, 0.0)
    kls, agreed = [], 0
    for start in range(0, base_all.shape[0], DIVERGENCE_ROWS):
        base = base_all[start : start + DIVERGENCE_ROWS].to(torch.float64)
        cand = cand_all[start : start + DIVERGENCE_ROWS].to(torch.float64)
        log_p, log_q = torch.log_softmax(base, dim=-1), torch.log_softmax(cand, dim=-1)
        kls.append((log_p.exp() * (log_p - log_q)).sum(dim=-1).clamp_min(0.0))  # [rows]
        agreed += int((base.argmax(dim=-1) == cand.argmax(dim=-1)).sum())
    kl = torch.cat(kls)
    positions = int(base_all.shape[0])
    return NextTokenDivergence(positions, agreed / positions, float(kl.mean()), float(kl.max()))


@dataclass(frozen=True)
class ScoreInterval:
    """A suite-level score with its two-sided confidence interval."""

    n: int
    score: float
    low: float
    high: float
    confidence: float
    method: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form with rounded numbers."""
        out = asdict(self)
        for key in ("score", "low", "high"):
            out[key] = round(out[key], 6)
        return out


def score_interval(scores: Sequence[float], confidence: float = 0.95, seed: int = 0) -> ScoreInterval:
    """Mean score with a two-sided interval: Clopper-Pearson for 0/1 scores, bootstrap otherwise."""
    values = np.asarray(scores, dtype=np.float64)
    n = int(values.size)
    if n == 0:
        return ScoreInterval(0, 0.0, 0.0, 1.0, confidence, "none")
    mean = float(values.mean())
    if _is_binary(values):
        ci = stats.binomtest(int(values.sum()), n).proportion_ci(confidence_level=confidence, method="exact")
        return ScoreInterval(n, mean, float(ci.low), float(ci.high), confidence, "Clopper-Pearson")
    if np.all(values == values[0]):
        return ScoreInterval(n, mean, mean, mean, confidence, "bootstrap (constant scores)")
    result = stats.bootstrap(
        (values,),
        np.mean,
        confidence_level=confidence,
        n_resamples=4999,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return ScoreInterval(n, mean, low, high, confidence, "bootstrap (percentile)")
