"""What a black-box profile of an engine measured and how well the latency model fit it (blackbox.py), as kept
in the profile's fit quality (provenance.FitQuality.black_box)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servegate.capacity.bench.process_memory import ProcessGroupMemory

KEPT_UP = 0.9
"""A rate was kept up with when the engine's answers came at least this share as fast as the requests were sent."""


@dataclass(frozen=True)
class TtftPoint:
    """Typical TTFT (trimmed mean) and median finishing gap of lone requests with one prompt length."""

    prompt_tokens: int
    ttft_s: float
    finish_s: float


@dataclass(frozen=True)
class ItlRow:
    """The typical steady inter-token gap of bursts of `batch` requests whose sequences held `context` tokens."""

    batch: int
    context: float
    itl_s: float
    gaps: int
    """Gaps measured."""


@dataclass(frozen=True)
class KneeRate:
    """One rate of the knee sweep: what the engine achieved and how latency compared with the simulation."""

    rate_rps: float
    requests: int
    measured_requests_per_s: float
    measured_e2el_p50_ms: float
    simulated_e2el_p50_ms: float
    measured_ttft_p50_ms: float
    simulated_ttft_p50_ms: float
    kept_up: bool
    """Every request completed, and answered at least KEPT_UP as fast as sent (completion_rps against sent_rps)."""
    completion_rps: float | None = None
    """The engine's pace of answers (1 / the Theil-Sen slope of completion times against their rank). Once it
    falls behind, this is its capacity; while it keeps up, it follows the arrivals."""
    sent_rps: float | None = None
    """The pace of the scheduled sends, the same way: the rate the arrival process actually offered."""


SATURATION_WINDOW = 2.5
"""Runs past the knee count as measurements of the capacity only up to this factor above the lowest rate missed.
Far past it the pace is another machine's: on vLLM's CPU build the sweep's first run, at 10x the capacity, answered
98.9 requests/s where the runs near the knee answered 38.5-44.1 (a backlog of hundreds of requests batches more
than any load near the knee), and the capacity's interval, built on their spread, went down to 0."""


@dataclass(frozen=True)
class KneeSweep:
    """The open-loop rate search around the capacity the fitted model predicts (blackbox.knee_sweep)."""

    predicted_capacity_rps: float
    measured_knee_rps: float | None
    """The highest rate the engine kept up with (None: none of them)."""
    rates: tuple[KneeRate, ...]
    """In the order measured."""
    missed_rps: float | None = None
    """The lowest rate it fell behind at (None: it kept up with every one)."""
    measured_capacity_rps: float | None = None
    """The median pace of answers over the runs past the knee (None: fewer than two such runs)."""
    arrival_s: float = 0.0
    """Seconds each request sent during a step was found to add to it: what profiles before serving_work_s
    fitted to the knee (kept so they load as they were fitted); 0 in newer ones."""
    serving_work_s: float = 0.0
    """Seconds of the machine per request beyond what lone requests and bursts show, fitted so that the simulated
    capacity is measured_capacity_rps (blackbox.fit_to_knee; ServingOverheads.serving_work_s); 0 when not fitted
    or when the engine's steps explain the capacity."""

    @property
    def bracketed(self) -> bool:
        """Whether the knee lies between a rate kept up with and a higher one that was not."""
        return self.measured_knee_rps is not None and self.missed_rps is not None

    @property
    def measured_range(self) -> tuple[float, float]:
        """The lowest and highest rates sent."""
        sent = [r.rate_rps for r in self.rates]
        return (min(sent), max(sent)) if sent else (0.0, 0.0)

    def saturated_rps(self) -> list[float]:
        """The engine's pace at every rate whose answers fell behind the sends (not a run missed only because a
        request failed), up to SATURATION_WINDOW times the lowest rate missed: each is one measurement of its
        capacity near the knee."""
        ceiling = SATURATION_WINDOW * (self.missed_rps or 0.0)
        return [
            r.completion_rps
            for r in self.rates
            if not r.kept_up
            and r.completion_rps
            and r.sent_rps
            and r.completion_rps < KEPT_UP * r.sent_rps
            and r.rate_rps <= ceiling
        ]

    def capacity_spread(self) -> float:
        """Relative spread (standard deviation / mean) of the saturated paces; 0 with fewer than two."""
        paces = self.saturated_rps()
        if len(paces) < 2:
            return 0.0
        mean = sum(paces) / len(paces)
        return (sum((x - mean) ** 2 for x in paces) / (len(paces) - 1)) ** 0.5 / mean

    def extrapolated(self, rate: float) -> bool:
        """Whether `rate` lies beyond what the sweep measured: above every rate it sent, or with no bracket (a rate
        below a bracketed knee is carried, as the rate kept up with was)."""
        return not self.bracketed or rate > self.measured_range[1]

    def position(self, rate: float) -> str:
        """Where `rate` lies against the knee, in words."""
        if self.extrapolated(rate):
            return "an extrapolation beyond what was measured"
        assert self.measured_knee_rps is not None and self.missed_rps is not None
        if rate < self.measured_knee_rps:
            return f"below the measured knee (kept up with at {self.measured_knee_rps:.3g})"
        if rate > self.missed_rps:
            return f"past the measured knee (fell behind at {self.missed_rps:.3g})"
        return "within the measured bracket"

    def lines(self) -> list[str]:
        """The knee in words: where the sweep bracketed it, and whether the predicted capacity lies there."""
        lo, hi = self.measured_range
        pred = self.predicted_capacity_rps
        if self.bracketed:
            line = (
                f"knee: measured between {self.measured_knee_rps:.3g} requests/s (kept up) and {self.missed_rps:.3g} "
                f"(fell behind) over {len(self.rates)} runs; the step fit predicted capacity {pred:.3g} requests/s, "
                f"{self.position(pred)}"
            )
            if self.measured_capacity_rps is None:
                return [line]
            if self.serving_work_s:
                fitted = (
                    f"under load each request takes a further {1000 * self.serving_work_s:.2f} ms of the machine, "
                    "which the requests served share"
                )
            elif self.arrival_s:
                fitted = f"each request sent during a step adds {1000 * self.arrival_s:.2f} ms to it, fitted"
            else:
                fitted = "the engine's steps explain it"
            return [
                line,
                f"  past the knee the engine answered {self.measured_capacity_rps:.3g} requests/s (median of "
                f"{len(self.saturated_rps())} runs within {SATURATION_WINDOW:g}x the rate missed); {fitted}",
            ]
        said = "kept up with every rate" if self.measured_knee_rps is not None else "kept up with none of its rates"
        return [
            f"knee: not measured - the sweep {said} from {lo:.3g} to {hi:.3g} requests/s; the predicted capacity "
            f"{pred:.3g} requests/s is an extrapolation"
        ]


@dataclass(frozen=True)
class SteadyStream:
    """The steady stream a black-box profile sends after the knee search, and the machine's drift fitted on it
    (drift_fit.py; StepJitter.drift_spread)."""

    rate_rps: float
    requests: int
    measured_mean_ms: float
    """Mean end-to-end latency of its answered requests."""
    measured_p50_ms: float
    measured_p99_ms: float
    measured_tail_ms: float
    """Its drift_fit.TAIL percentile, what the drift is fitted to."""
    simulated_tail_ms: float
    """The same percentile of the same requests simulated without drift (mean over drift_fit.DRIFT_SEEDS jitter
    seeds)."""
    fitted_tail_ms: float
    """Simulated with the fitted drift."""
    correlation: tuple[tuple[float, float, float], ...]
    """(shortest gap, longest gap, correlation) of the measured over simulated log latencies of requests sent that
    far apart, seconds: how long a slow moment lasts."""
    drift_spread: float
    drift_seconds: float
    simulated_p50_ms: float | None = None
    """The median simulated before the load stretch was fitted (stretch_fit.py; None: a profile made before it)."""
    fitted_p50_ms: float | None = None
    """The median simulated with the fitted load stretch, before the drift (which lowers it a little)."""
    load_stretch_per_rps: float = 0.0
    """The load stretch fitted to the measured median (ServingOverheads.load_stretch_per_rps)."""

    def lines(self) -> list[str]:
        """The stream, the load stretch and the drift in words, in the order they were fitted."""
        head = (
            f"steady stream: {self.requests} requests at {self.rate_rps:.3g} requests/s, E2E mean "
            f"{self.measured_mean_ms:.1f} ms (p50 {self.measured_p50_ms:.1f}, p95 {self.measured_tail_ms:.1f}, p99 "
            f"{self.measured_p99_ms:.1f})"
        )
        lines = [head]
        if self.simulated_p50_ms is not None and self.fitted_p50_ms is not None:
            if not self.load_stretch_per_rps:
                said = f"p50 simulated {self.simulated_p50_ms:.1f} ms, no load stretch fitted (the model is as slow)"
            else:
                said = (
                    f"load: requests {100 * self.load_stretch_per_rps * self.rate_rps:.0f}% slower at this rate "
                    f"({100 * self.load_stretch_per_rps:.2f}% per request/s served), on top of the serving work; p50 "
                    f"simulated {self.simulated_p50_ms:.1f} ms without it, {self.fitted_p50_ms:.1f} with it"
                )
            lines.append(f"  {said}")
        if not self.drift_spread:
            lines.append(
                f"  p95 simulated without drift {self.simulated_tail_ms:.1f} ms; no drift fitted (the steps explain "
                "it, or slow moments do not last)"
            )
        else:
            lines.append(
                f"  drift: p95 simulated {self.simulated_tail_ms:.1f} ms without it; the machine's slowdown spreads by "
                f"{self.drift_spread:.2f} (log s.d.) and lasts {self.drift_seconds:.2g} s (correlation time); p95 "
                f"simulated with it {self.fitted_tail_ms:.1f} ms"
            )
        return lines


@dataclass(frozen=True)
class BlackBoxFit:
    """The sweeps of a black-box profile and the fit's error on them."""

    endpoint: str
    """The URL (or backend) profiled."""
    ttft_points: tuple[TtftPoint, ...]
    itl_points: tuple[ItlRow, ...]
    ttft_median_rel_error: float
    itl_median_rel_error: float
    knee: KneeSweep | None = None
    """None when the manifest declares no capacity.workload to sweep."""
    profile_seconds: float = 0.0
    process_memory: ProcessGroupMemory | None = None
    """The resident memory of the engine's processes after the sweeps, for an engine servegate started (None:
    an endpoint it cannot see into)."""
    stream: SteadyStream | None = None
    """The steady stream the drift was fitted on (None: no knee measured, or a profile made before it)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BlackBoxFit:
        """Inverse of dataclasses.asdict."""
        knee = data.get("knee")
        return cls(
            endpoint=str(data.get("endpoint", "")),
            ttft_points=tuple(TtftPoint(**row) for row in data.get("ttft_points") or ()),
            itl_points=tuple(ItlRow(**row) for row in data.get("itl_points") or ()),
            ttft_median_rel_error=float(data["ttft_median_rel_error"]),
            itl_median_rel_error=float(data["itl_median_rel_error"]),
            knee=KneeSweep(
                float(knee["predicted_capacity_rps"]),
                knee.get("measured_knee_rps"),
                tuple(KneeRate(**row) for row in knee.get("rates") or ()),
                knee.get("missed_rps"),
                knee.get("measured_capacity_rps"),
                float(knee.get("arrival_s", 0.0)),
                float(knee.get("serving_work_s", 0.0)),
            )
            if knee
            else None,
            profile_seconds=float(data.get("profile_seconds", 0.0)),
            process_memory=ProcessGroupMemory.from_dict(data["process_memory"]) if data.get("process_memory") else None,
            stream=_stream(data.get("stream")),
        )


def _stream(data: Mapping[str, Any] | None) -> SteadyStream | None:
    """A SteadyStream from its dataclasses.asdict form (None stays None)."""
    if not data:
        return None
    fields = {**data, "correlation": tuple(tuple(float(x) for x in row) for row in data.get("correlation") or ())}
    return SteadyStream(**fields)
