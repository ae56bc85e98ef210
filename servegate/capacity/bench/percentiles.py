"""How sure a latency percentile is: its distribution-free interval and its conservative (early-stopping) estimate.

Both come from order statistics and the binomial distribution alone, so they hold whatever the shape
of the latency distribution. Of n samples, the number below the true q-quantile Q is Binomial(n, q):

- interval: the sorted samples x(l) <= Q <= x(u) with probability >= `confidence`, the ranks l and u
  taken from the binomial's two tails; it cannot be formed ("n too small") when even the smallest or
  the largest sample is not far enough out (a 95% interval of p99 needs 367 samples);
- conservative estimate (MLPerf LoadGen's early stopping, written here from its published rule): the
  t-th largest sample, where t is the most over-the-percentile samples that n samples can hold and
  still show, at `EARLY_STOPPING_CONFIDENCE`, that the percentile is below that sample. It needs a
  floor of samples (t >= 1): 64 for p90, 130 for p95, 662 for p99 at LoadGen's 99% confidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import stats

INTERVAL_CONFIDENCE = 0.95
"""Confidence of every percentile interval servegate reports."""

EARLY_STOPPING_CONFIDENCE = 0.99
"""Confidence of the conservative estimate: LoadGen's default, so its query floors are LoadGen's."""

_LARGEST_N = 10**9
"""Searches for a sample count stop here (no bench sends more)."""


def interval_ranks(n: int, q: float, confidence: float = INTERVAL_CONFIDENCE) -> tuple[int, int] | None:
    """1-based ranks (l, u) with P(x(l) <= Q_q <= x(u)) >= confidence for n samples (None: n too small)."""
    if n < 1:
        return None
    tail = (1 - confidence) / 2
    p = q / 100
    low = int(stats.binom.ppf(tail, n, p))  # B(low - 1) < tail: x(low) falls above Q with chance < tail
    high = int(stats.binom.ppf(1 - tail, n, p)) + 1  # B(high - 1) >= 1 - tail
    if low < 1 or high > n:
        return None
    return low, high


@lru_cache(maxsize=256)
def interval_floor(q: float, confidence: float = INTERVAL_CONFIDENCE) -> int:
    """The fewest samples whose `confidence` interval of the q-th percentile can be formed."""
    return _smallest_n(lambda n: interval_ranks(n, q, confidence) is not None)


def overlatency_allowed(n: int, q: float, confidence: float = EARLY_STOPPING_CONFIDENCE) -> int:
    """The most samples above the q-th percentile that n samples can hold and still bound it (LoadGen's t).

    The largest t with P(Binomial(n, 1 - q/100) <= t) < 1 - confidence; -1 when even none above it would not
    do (LoadGen's server rule: a run passes a bound when no more than t of its requests exceed it).
    """
    if n < 1:
        return -1
    over = 1 - q / 100
    t = int(stats.binom.ppf(1 - confidence, n, over))  # smallest k with CDF(k) >= 1 - confidence
    while t > 0 and stats.binom.cdf(t - 1, n, over) >= 1 - confidence:  # guard the float edge of ppf
        t -= 1
    while stats.binom.cdf(t, n, over) < 1 - confidence:
        t += 1
    return t - 1


@lru_cache(maxsize=256)
def early_stopping_floor(q: float, confidence: float = EARLY_STOPPING_CONFIDENCE) -> int:
    """The fewest samples that give a conservative estimate of the q-th percentile (p90: 64, p99: 662)."""
    return _smallest_n(lambda n: overlatency_allowed(n, q, confidence) >= 1)


def conservative_estimate(
    sorted_values: Sequence[float] | np.ndarray, q: float, confidence: float = EARLY_STOPPING_CONFIDENCE
) -> float | None:
    """The early-stopping estimate of the q-th percentile of ascending `sorted_values` (None below the floor)."""
    n = len(sorted_values)
    t = overlatency_allowed(n, q, confidence)
    return float(sorted_values[n - t]) if t >= 1 else None


def bound_holds(n: int, over: int, q: float, confidence: float = EARLY_STOPPING_CONFIDENCE) -> bool:
    """Whether n requests, `over` of them above a bound, show at `confidence` that the q-th percentile is within it."""
    return over <= overlatency_allowed(n, q, confidence)


def requests_to_pass(n: int, over: int, q: float, confidence: float = EARLY_STOPPING_CONFIDENCE) -> int:
    """How many more requests, all within a bound, would show the q-th percentile within it (LoadGen's advice).

    `over` of the n requests so far exceeded the bound; with none more over, the total N must hold `over`.
    """
    total = _smallest_n(lambda m: overlatency_allowed(m, q, confidence) >= over, start=max(n, 1))
    return total - n


def lower_bound(
    sorted_values: Sequence[float] | np.ndarray, q: float, confidence: float = INTERVAL_CONFIDENCE
) -> float | None:
    """The lower end of the two-sided `confidence` interval of the q-th percentile, even when its upper end
    cannot be formed (high percentiles of few samples); None when not even the smallest sample is low enough."""
    n = len(sorted_values)
    if n < 1:
        return None
    low = int(stats.binom.ppf((1 - confidence) / 2, n, q / 100))
    return float(sorted_values[low - 1]) if low >= 1 else None


def _smallest_n(ok: Any, start: int = 1) -> int:
    """The smallest n >= start with ok(n), for a monotone ok (doubling, then bisection)."""
    if ok(start):
        return start
    low, high = start, max(2 * start, 2)
    while not ok(high):
        low, high = high, 2 * high
        if high > _LARGEST_N:
            raise ValueError("no sample count up to 1e9 satisfies the condition")
    while high - low > 1:
        mid = (low + high) // 2
        if ok(mid):
            high = mid
        else:
            low = mid
    return high


@dataclass(frozen=True)
class PercentileEstimate:
    """One percentile of n samples: the interpolated value, its interval and its conservative estimate."""

    q: float
    """Percentile, 0-100."""
    n: int
    """Samples it was computed from."""
    value: float
    """Empirical percentile by linear interpolation (nan for no samples)."""
    ci: tuple[float, float] | None
    """INTERVAL_CONFIDENCE interval of the true percentile (None: n too small)."""
    ci_reason: str | None
    """Why there is no interval (None when there is one)."""
    conservative: float | None
    """Early-stopping estimate at EARLY_STOPPING_CONFIDENCE (None below the floor)."""
    floor: int
    """Samples the conservative estimate needs."""

    @property
    def conservative_reason(self) -> str | None:
        """Why there is no conservative estimate (None when there is one)."""
        if self.conservative is not None:
            return None
        return f"n too small: a conservative p{self.q:g} needs at least {self.floor} samples (got {self.n})"

    def fields(self) -> dict[str, Any]:
        """The JSON fields beside `pN`: `pN_ci`, `pN_ci_reason`, `pN_conservative`, and its reason and floor."""
        key = f"p{self.q:g}"
        return {
            f"{key}_ci": list(self.ci) if self.ci is not None else None,
            f"{key}_ci_reason": self.ci_reason,
            f"{key}_conservative": self.conservative,
            f"{key}_conservative_reason": self.conservative_reason,
            f"{key}_floor": self.floor,
        }


def estimate(
    values: Sequence[float] | np.ndarray, q: float, confidence: float = INTERVAL_CONFIDENCE
) -> PercentileEstimate:
    """The q-th percentile of `values` with its interval and conservative estimate."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    floor = early_stopping_floor(q)
    if n == 0:
        return PercentileEstimate(q, 0, float("nan"), None, "no samples", None, floor)
    value = float(np.percentile(x, q, method="linear"))
    ranks = interval_ranks(n, q, confidence)
    if ranks is None:
        need = interval_floor(q, confidence)
        reason = f"n too small: a {100 * confidence:g}% interval of p{q:g} needs at least {need} samples (got {n})"
        ci = None
    else:
        ci, reason = (float(x[ranks[0] - 1]), float(x[ranks[1] - 1])), None
    return PercentileEstimate(q, n, value, ci, reason, conservative_estimate(x, q), floor)


def interval_fields(values: Sequence[float] | np.ndarray, percentiles: Sequence[float]) -> dict[str, Any]:
    """`pN_ci`, `pN_ci_reason`, `pN_conservative`, ... for each percentile of `values` (a bench's JSON fields)."""
    out: dict[str, Any] = {}
    for q in percentiles:
        out.update(estimate(values, q).fields())
    return out


def _scale(values: Sequence[float]) -> tuple[float, str]:
    return (1000.0, "s") if max(values) >= 1000 else (1.0, "ms")


def describe(label: str, stats_ms: dict[str, Any], q: float, unit: str = "requests") -> str:
    """What one reported percentile supports, in words, from a bench JSON latency entry (`ttft_ms`, ...).

    E.g. `p99 E2E 1.9 s (95% interval 1.7-2.3 s, 700 requests; conservative 2.2 s)` or, below the floors,
    `p99 E2E 1.9 s (40 requests; too few for a 95% interval, which needs 368); p99 not estimable below 662 requests`.
    """
    key = f"p{q:g}"
    n = int(stats_ms.get("count") or 0)
    if n == 0:
        return f"{key} {label}: no {unit} measured"
    value = float(stats_ms[key])
    ci = stats_ms.get(f"{key}_ci")
    conservative = stats_ms.get(f"{key}_conservative")
    div, name = _scale([value, *(ci or []), *([conservative] if conservative is not None else [])])
    pct = f"{100 * INTERVAL_CONFIDENCE:g}%"
    inside: list[str] = []
    if ci is not None:
        inside.append(f"{pct} interval {ci[0] / div:.3g}-{ci[1] / div:.3g} {name}, {n} {unit}")
    else:
        inside.append(f"{n} {unit}; too few for a {pct} interval, which needs {interval_floor(q)}")
    if conservative is not None:
        inside.append(f"conservative {float(conservative) / div:.3g} {name}")
    text = f"{key} {label} {value / div:.3g} {name} ({'; '.join(inside)})"
    if conservative is None:
        floor = stats_ms.get(f"{key}_floor") or early_stopping_floor(q)
        text += f"; {key} not estimable below {floor} {unit}"
    return text
