"""What a black-box profile of an engine measured and how well the latency model fit it (blackbox.py), as kept
in the profile's fit quality (provenance.FitQuality.black_box)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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
    """Achieved at least blackbox.KEPT_UP of the offered rate."""


@dataclass(frozen=True)
class KneeSweep:
    """The short open-loop sweep around the capacity the fitted model predicts."""

    predicted_capacity_rps: float
    measured_knee_rps: float | None
    """The highest rate the engine kept up with (None: none of them)."""
    rates: tuple[KneeRate, ...]


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
            )
            if knee
            else None,
            profile_seconds=float(data.get("profile_seconds", 0.0)),
        )
