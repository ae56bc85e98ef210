"""The middle of the steady stream: how the stretch under load grows below the knee, fitted on the stream's median.

The serving work fitted to the knee (blackbox.fit_to_knee: processor sharing, every part of a request stretched by
1 / (1 - r x serving_work_s) at r requests/s served) fixes where the machine runs out. It does not fix how the
stretch grows on the way there, and on vLLM's CPU build it grows faster than processor sharing's: the simulated
median of the profile's stream, at 0.6-0.7x the capacity and without drift, was 46 ms against 75 measured in one
profile and 56 against 105 in another (2026-12-05, benchmarks/README.md, issue 40). The stream is a second load
point, and its median pins the shape.

Before the drift (drift_fit.py), the stretch's linear part (ServingOverheads.load_stretch_per_rps: the stretch
becomes (1 + r x a) / (1 - r x serving_work_s)) is bisected until the stream simulated with it (over
drift_fit.DRIFT_SEEDS seeds) has the measured median; the drift is then fitted to the stream's tail on top of it.
The serving work is fitted to the knee again at each value tried (`refit`), so the capacity stays the measured one,
and the stretch below the knee grows with `a`. A step's own load slowdown (ServingOverheads.load_slowdown_per_rps,
stage 4 of servegate's own runtime) was tried first and does not serve: it slows the steps only, and as it grew the
refitted serving work took the stretch off the HTTP and tokenization overheads, which hold most of a short
request's time on vLLM, so the stream's median fell (124 to 39 ms in one profile). The linear part stays 0 when the
model is already as slow as the stream: a machine that runs faster under load is not what was measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.bench.workload import RequestSpec
from servegate.capacity.latency.drift_fit import measured_e2e, seeds_percentile, simulated_e2e
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.simulate import SimSetup

STRETCH_MAX = 4.0
"""Most the linear part stretches a request at the stream's rate (the factor 1 + 4 = 5x, before processor
sharing's)."""
STRETCH_BISECTIONS = 7
"""Halvings of [0, STRETCH_MAX]: to within 0.03 of the factor (each one refit to the knee and DRIFT_SEEDS stream
simulations, about 0.5 s for vLLM's quickstart on 2 cores)."""


@dataclass(frozen=True)
class StretchFit:
    """What the stream's record keeps of the fit (SteadyStream's fields of the same names)."""

    simulated_p50_ms: float
    """The stream's median simulated with the stretch's linear part at 0."""
    fitted_p50_ms: float
    """Simulated with the fitted one."""
    load_stretch_per_rps: float


def _with_stretch(model: LatencyModel, per_rps: float) -> LatencyModel:
    return replace(model, overheads=replace(model.overheads, load_stretch_per_rps=per_rps))


def fit_load_stretch(
    setup: SimSetup,
    model: LatencyModel,
    specs: Sequence[RequestSpec],
    records: Sequence[RequestRecord],
    rate_rps: float,
    refit: Callable[[LatencyModel], LatencyModel] = lambda m: m,
) -> tuple[LatencyModel, StretchFit | None]:
    """The model with its load stretch fitted to the stream's measured median (see the module notes; one the
    model already has is fitted again from 0), and what the stream's record keeps of it (None when no request
    was answered). A value whose refit leaves no serving work (the stretch alone already keeps less than the
    measured capacity) counts as too much, so the capacity holds."""
    measured = measured_e2e(records)
    ok = np.isfinite(measured) & (measured > 0)
    if not ok.any():
        return model, None
    drift = model.jitter.drift_spread > 0
    target = float(np.median(measured[ok]))

    def middle(candidate: LatencyModel) -> float:
        return seeds_percentile(simulated_e2e(setup, candidate, specs, drift=drift)[:, ok], 50)

    start = refit(_with_stretch(model, 0.0)) if model.overheads.load_stretch_per_rps else model

    def short(factor: float) -> bool:
        """Whether the stream simulated with this factor at its rate is still faster than measured."""
        candidate = refit(_with_stretch(model, factor / rate_rps))
        if start.overheads.serving_work_s and not candidate.overheads.serving_work_s:
            return False
        return middle(candidate) < target

    before = middle(start)
    fitted, per_rps, after = start, 0.0, before
    if before < target:
        low, high = 0.0, STRETCH_MAX
        if short(high):
            low = high
        for _ in range(STRETCH_BISECTIONS if low < high else 0):
            mid = (low + high) / 2
            low, high = (mid, high) if short(mid) else (low, mid)
        per_rps = (low + high) / 2 / rate_rps
        fitted = refit(_with_stretch(model, per_rps))
        after = middle(fitted)
    return fitted, StretchFit(1000 * before, 1000 * after, per_rps)
