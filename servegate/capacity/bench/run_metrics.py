"""Latency and throughput metrics of a run, defined once and shared by the bench, the simulator and the gate.

Every latency is counted from the request's SCHEDULED send time (when the arrival process said it
should go out), not from when the client managed to send it: a slow server or a slow client cannot
hide queueing that way (no coordinated omission).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DEFINITIONS: dict[str, str] = {
    "TTFT": "time to first token: first streamed token - scheduled send time",
    "TPOT": "time per output token: (E2EL - TTFT) / (output tokens - 1), requests with >= 2 output tokens",
    "ITL": "inter-token latency: gap between consecutive streamed chunks of one request, all requests pooled",
    "E2EL": "end-to-end latency: last byte of the response - scheduled send time",
    "percentiles": "pN by linear interpolation between the closest ranks (numpy 'linear', Hyndman-Fan type 7)",
    "pN_ci": "95% interval of the true pN from order statistics (binomial, any distribution); null when n is too "
    "small, with pN_ci_reason",
    "pN_conservative": "MLPerf LoadGen's early-stopping estimate of pN at 99% confidence (the t-th largest sample); "
    "null below its floor pN_floor (p90: 64, p95: 130, p99: 662 samples)",
    "dispatch delay": "actual send - scheduled send, per request: the client's own lateness",
    "throughput": "completed requests (and their output tokens) / (last completion - first scheduled send)",
    "goodput": "completed requests that met every declared SLO / the same duration",
}
"""What each reported figure means; printed with every bench result."""

PERCENTILES = (50, 95, 99)


@dataclass
class RequestRecord:
    """The timeline of one request, all times in seconds on one monotonic clock."""

    scheduled: float
    """When the arrival process scheduled the request to be sent."""
    sent: float | None = None
    """When the client actually sent it (>= scheduled when the client falls behind)."""
    token_times: list[float] = field(default_factory=list)
    """Arrival time of each streamed chunk that carried output."""
    end: float | None = None
    """When the response completed (None: not completed)."""
    output_tokens: int = 0
    """Output tokens the server reported (or chunks counted when it reports none)."""
    prompt_tokens: int = 0
    """Prompt tokens the server reported (0 when unknown)."""
    error: str | None = None
    """Error code or message when the request failed."""
    error_class: str | None = None
    """A short class of the error for counting (e.g. `HTTP 400 context_length_exceeded`)."""
    requested_prompt_tokens: int = 0
    """Prompt tokens the workload asked for."""
    requested_output_tokens: int = 0
    """`max_tokens` sent."""
    usage_prompt_tokens: int | None = None
    """`usage.prompt_tokens` of the response (None: the server reported none)."""
    usage_output_tokens: int | None = None
    """`usage.completion_tokens` of the response (None: the server reported none)."""
    chunks: int = 0
    """Streamed chunks that carried output."""
    request_id: str | None = None
    """The id the server answered with (its step trace records admissions by it; None: none seen)."""

    @property
    def ok(self) -> bool:
        """Completed without error and with at least one output token."""
        return self.error is None and self.end is not None and bool(self.token_times)

    @property
    def dispatch_delay(self) -> float | None:
        """Actual send - scheduled send, seconds (None: never sent)."""
        return None if self.sent is None else self.sent - self.scheduled

    @property
    def ttft(self) -> float:
        """Time to first token, seconds."""
        return self.token_times[0] - self.scheduled

    @property
    def e2el(self) -> float:
        """End-to-end latency, seconds."""
        assert self.end is not None
        return self.end - self.scheduled

    @property
    def tpot(self) -> float | None:
        """(E2EL - TTFT) / (output tokens - 1), seconds; None for single-token outputs."""
        if self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        """Gaps between consecutive streamed chunks, seconds."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


@dataclass(frozen=True)
class LatencyStats:
    """Mean and percentiles of one latency, in milliseconds."""

    mean: float
    p50: float
    p95: float
    p99: float
    count: int

    def as_dict(self) -> dict[str, float | int]:
        """{mean, p50, p95, p99, count}."""
        return {"mean": self.mean, "p50": self.p50, "p95": self.p95, "p99": self.p99, "count": self.count}

    def at(self, percentile: str) -> float:
        """The value named `p50`, `p95`, `p99` or `mean`."""
        return float(getattr(self, percentile))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile by linear interpolation (nan for no values)."""
    if len(values) == 0:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=float), q, method="linear"))


def latency_stats(seconds: Iterable[float]) -> LatencyStats:
    """Summarize latencies given in seconds as milliseconds."""
    ms = [1000.0 * s for s in seconds]
    if not ms:
        nan = float("nan")
        return LatencyStats(nan, nan, nan, nan, 0)
    return LatencyStats(float(np.mean(ms)), percentile(ms, 50), percentile(ms, 95), percentile(ms, 99), len(ms))


@dataclass(frozen=True)
class SLO:
    """Per-request service-level objectives for goodput, in milliseconds (None: not constrained)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def met_by(self, r: RequestRecord) -> bool:
        """Whether one completed request met every declared objective."""
        if not r.ok:
            return False
        if self.ttft_ms is not None and 1000 * r.ttft > self.ttft_ms:
            return False
        tpot = r.tpot
        if self.tpot_ms is not None and tpot is not None and 1000 * tpot > self.tpot_ms:
            return False
        return self.e2el_ms is None or 1000 * r.e2el <= self.e2el_ms

    def as_dict(self) -> dict[str, float | None]:
        """{ttft_ms, tpot_ms, e2el_ms}."""
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2el_ms": self.e2el_ms}


def latency_summary(seconds: Iterable[float], intervals: bool = False) -> dict[str, Any]:
    """`latency_stats(...).as_dict()`, with each percentile's interval and conservative estimate when asked."""
    values = list(seconds)
    out: dict[str, Any] = latency_stats(values).as_dict()
    if intervals:
        from servegate.capacity.bench.percentiles import interval_fields

        out.update(interval_fields([1000.0 * v for v in values], PERCENTILES))
    return out


def summarize(records: Sequence[RequestRecord], slo: SLO | None = None, intervals: bool = False) -> dict[str, Any]:
    """The bench's result for one run: latencies, throughput and goodput, every figure with its unit in its key.

    With `intervals`, every latency percentile comes with its interval and conservative estimate (percentiles.py)
    and the dispatch delay distribution is added; the simulator, which runs thousands of times, goes without.
    """
    done = [r for r in records if r.ok]
    if records:
        start = min(r.scheduled for r in records)
        end = max((r.end for r in done if r.end is not None), default=start)
    else:
        start = end = 0.0
    duration = max(end - start, 1e-9)
    out_tokens = sum(r.output_tokens for r in done)
    slo = slo or SLO()
    good = [r for r in done if slo.met_by(r)]
    out = {
        "ttft_ms": latency_summary((r.ttft for r in done), intervals),
        "tpot_ms": latency_summary((t for r in done if (t := r.tpot) is not None), intervals),
        "itl_ms": latency_summary((g for r in done for g in r.itls), intervals),
        "e2el_ms": latency_summary((r.e2el for r in done), intervals),
        "throughput": {
            "requests_per_s": len(done) / duration,
            "output_tokens_per_s": out_tokens / duration,
        },
        "goodput": {
            "requests_per_s": len(good) / duration,
            "fraction": len(good) / len(records) if records else float("nan"),
            "slo": slo.as_dict(),
        },
        "requests": {"sent": len(records), "completed": len(done), "failed": len(records) - len(done)},
        "duration_s": duration,
        "output_tokens": out_tokens,
        "max_send_lag_ms": 1000 * max((r.sent - r.scheduled for r in records if r.sent is not None), default=0.0),
    }
    if intervals:
        delays = [d for r in records if (d := r.dispatch_delay) is not None]
        out["dispatch_delay_ms"] = {**latency_stats(delays).as_dict(), "max": out["max_send_lag_ms"]}
    return out


def slo_from_targets(targets: Any) -> SLO:
    """Per-request SLOs from the manifest's latency targets: the strictest-percentile budget is the tail bound.

    A request counts toward goodput when it is within the budget declared for the highest percentile
    (p99 if declared, else p95, else p50) of each of TTFT, TPOT and end-to-end latency.
    """
    if targets is None:
        return SLO()

    def bound(pct: Any) -> float | None:
        if pct is None:
            return None
        return pct.p99 or pct.p95 or pct.p50

    return SLO(bound(targets.ttft_ms), bound(targets.tpot_ms), bound(targets.e2e_ms))
