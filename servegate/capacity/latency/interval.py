"""A prediction interval for a run's latency percentiles, from the step jitter the profile measured.

One measured run is one draw of the server's noise: its p50 and p99 land somewhere around the model's
central prediction. The simulator replays that noise (log-normal step slowdowns with the profile's spread
and step-to-step correlation), so the same requests simulated under many jitter seeds give the spread of
what one run can measure; the interval is its central `level` share. It holds for the machine as it ran
when profiled: a machine that changed speed since moves every run outside it together (speed_check.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from servegate.capacity.bench.workload import RequestSpec
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.simulate import SimSetup, simulate

INTERVAL_LEVEL = 0.90
"""Share of runs the interval is meant to hold."""
INTERVAL_SEEDS = 20
"""Jitter seeds simulated for one interval."""
METRICS = ("ttft_ms", "tpot_ms", "e2el_ms")
POINTS = ("p50", "p95", "p99")


@dataclass(frozen=True)
class PredictionInterval:
    """Per metric and percentile: the central prediction and the interval one run should fall in."""

    level: float
    seeds: int
    central: dict[str, dict[str, float]]
    """metric -> percentile -> median over the seeds, ms."""
    low: dict[str, dict[str, float]]
    high: dict[str, dict[str, float]]

    def contains(self, metric: str, point: str, value: float) -> bool:
        """Whether a measured value lies in the interval."""
        return self.low[metric][point] <= value <= self.high[metric][point]

    def relative_width(self, metric: str, point: str) -> float:
        """(high - low) / central."""
        mid = self.central[metric][point]
        return (self.high[metric][point] - self.low[metric][point]) / mid if mid > 0 else float("nan")

    def as_dict(self) -> dict[str, Any]:
        """JSON form: level, seeds and per metric {p: {central, low, high}}."""
        return {
            "level": self.level,
            "seeds": self.seeds,
            **{
                m: {p: {"central": self.central[m][p], "low": self.low[m][p], "high": self.high[m][p]} for p in POINTS}
                for m in self.central
            },
        }


def prediction_interval(
    setup: SimSetup,
    model: LatencyModel,
    specs: Sequence[RequestSpec],
    *,
    concurrency: int | None = None,
    level: float = INTERVAL_LEVEL,
    seeds: int = INTERVAL_SEEDS,
    first_seed: int = 0,
) -> PredictionInterval:
    """Simulate `specs` under `seeds` jitter seeds; the central `level` share of each percentile's values."""
    if not 0 < level < 1:
        raise ValueError(f"an interval's level is a share between 0 and 1 (got {level})")
    runs = [simulate(setup, model, specs, concurrency=concurrency, seed=first_seed + s).summary() for s in range(seeds)]
    tail = 100 * (1 - level) / 2
    central: dict[str, dict[str, float]] = {}
    low: dict[str, dict[str, float]] = {}
    high: dict[str, dict[str, float]] = {}
    for m in METRICS:
        central[m], low[m], high[m] = {}, {}, {}
        for p in POINTS:
            values = np.array([float(r[m][p]) for r in runs], dtype=float)
            values = values[np.isfinite(values)]
            if values.size == 0:
                values = np.array([float("nan")])
            central[m][p] = float(np.median(values))
            low[m][p] = float(np.percentile(values, tail))
            high[m][p] = float(np.percentile(values, 100 - tail))
    return PredictionInterval(level, seeds, central, low, high)
