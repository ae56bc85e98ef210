"""Absolute latency targets judged on what the sample can show, not on one run's point figure.

A target `pN <= B` over n measured requests, `over` of them above B:

    pass   the sample shows, at 99% confidence (LoadGen's early-stopping rule), that pN is within B:
           no more than LoadGen's t of the n requests are over B (the conservative estimate is within B
           or within one order statistic of it)
    fail   the lower end of the 95% interval of pN is above B: pN is over its budget, whatever the noise
    warn   neither (the interval straddles B, or the sample is under the floor): inconclusive, with how
           many more requests, all within B, would pass it

A planted regression that puts most requests over B fails; a moving machine that adds a few slow
requests leaves the verdict inconclusive rather than failing a change that did nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from servegate.capacity.bench.percentiles import (
    bound_holds,
    conservative_estimate,
    early_stopping_floor,
    interval_ranks,
    lower_bound,
    requests_to_pass,
)
from servegate.capacity.bench.run_metrics import RequestRecord

LATENCY_TARGETS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E"}
"""Manifest latency targets and their labels."""


def latencies_ms(records: Sequence[RequestRecord], field: str) -> np.ndarray:
    """Ascending per-request latencies of `ttft_ms`, `tpot_ms` or `e2e_ms` over the completed requests, ms."""
    done = [r for r in records if r.ok]
    if field == "ttft_ms":
        values = [r.ttft for r in done]
    elif field == "tpot_ms":
        values = [t for r in done if (t := r.tpot) is not None]
    else:
        values = [r.e2el for r in done]
    return np.sort(np.asarray(values, dtype=float) * 1000.0)


@dataclass(frozen=True)
class BoundCheck:
    """One latency target against the sample: its verdict and what the sample supports."""

    name: str
    """e.g. `e2e_ms.p99`."""
    q: float
    """Percentile, 0-100."""
    target_ms: float
    """The declared budget."""
    verdict: Literal["pass", "fail", "warn"]
    measured_ms: float
    """Interpolated percentile (nan for no sample)."""
    conservative_ms: float | None
    """LoadGen's early-stopping estimate (None below its floor)."""
    interval_ms: tuple[float | None, float | None]
    """95% interval; the upper end is None where n is too small, the lower end where even it is."""
    n: int
    over: int
    """Requests over the budget."""
    more_requests: int | None
    """For `warn`: requests, all within the budget, that would pass it."""

    def sentence(self) -> str:
        """One line: the verdict and the numbers behind it."""
        lo, hi = self.interval_ms
        shown = f"{lo:.4g}-{hi:.4g} ms" if lo is not None and hi is not None else (
            f"above {lo:.4g} ms" if lo is not None else "none"
        )  # fmt: skip
        conservative = f"{self.conservative_ms:.4g} ms" if self.conservative_ms is not None else (
            f"not estimable below {early_stopping_floor(self.q)} requests"
        )  # fmt: skip
        head = (
            f"{self.name} {self.measured_ms:.4g} ms against {self.target_ms:g} ms ({self.over} of {self.n} requests "
            f"over; 95% interval {shown}; conservative {conservative})"
        )
        if self.verdict == "pass":
            return f"{head}: within it at 99% confidence"
        if self.verdict == "fail":
            return f"{head}: over it, the whole interval above the target"
        return f"{head}: inconclusive; {self.more_requests} more requests, all within it, would pass it"

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "name": self.name,
            "target": self.target_ms,
            "predicted": self.measured_ms,
            "unit": "ms",
            "verdict": self.verdict,
            "met": self.verdict == "pass",
            "missed_by": max(0.0, self.measured_ms - self.target_ms) if self.n else None,
            "conservative": self.conservative_ms,
            "interval": list(self.interval_ms),
            "n": self.n,
            "over": self.over,
            "more_requests": self.more_requests,
        }


def judge_bound(name: str, sorted_ms: np.ndarray, q: float, target_ms: float) -> BoundCheck:
    """The verdict on `pN <= target_ms` from ascending latencies (see the module docstring)."""
    n = len(sorted_ms)
    over = int(np.sum(sorted_ms > target_ms))
    measured = float(np.percentile(sorted_ms, q)) if n else float("nan")
    low = lower_bound(sorted_ms, q)
    ranks = interval_ranks(n, q)
    high = float(sorted_ms[ranks[1] - 1]) if ranks is not None else None
    more = None
    if n and bound_holds(n, over, q):
        verdict: Literal["pass", "fail", "warn"] = "pass"
    elif low is not None and low > target_ms:
        verdict = "fail"
    else:
        verdict, more = "warn", requests_to_pass(n, over, q)
    return BoundCheck(
        name, q, target_ms, verdict, measured, conservative_estimate(sorted_ms, q), (low, high), n, over, more
    )


def judge_latency_targets(targets: Any, records: Sequence[RequestRecord]) -> list[BoundCheck]:
    """Every declared latency percentile target against the completed requests of `records`."""
    checks: list[BoundCheck] = []
    if targets is None:
        return checks
    for field in LATENCY_TARGETS:
        pct = getattr(targets, field)
        if pct is None:
            continue
        values = latencies_ms(records, field)
        for p in ("p50", "p95", "p99"):
            bound = getattr(pct, p)
            if bound is not None:
                checks.append(judge_bound(f"{field}.{p}", values, float(p[1:]), float(bound)))
    return checks
