"""Profiling stages 4 and 5: the traced runs simulated end to end, and the few numbers that make them match.

Near capacity a few percent of step time moves latency by tens of percent, so after the step coefficients
are refitted on the traced steps (serving_trace.py), the runs below capacity are simulated and two numbers
are chosen so that their mean end-to-end latency matches: a scale of the step times and a slowdown per
request/s sent (what a busier server takes from the engine beyond the per-request costs); then the
admission delay per running sequence that matches their TTFT. Each search is a coarse grid, then a finer
one around its best point; the grids are the constants below.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.provenance import TracedRunFit
from servegate.capacity.latency.serving_trace import TracedRun
from servegate.capacity.latency.simulate import SimSetup, simulate

SCALE_GRID = tuple(0.8 + 0.03 * i for i in range(14))
"""Coarse step-time scales searched: 0.80 to 1.19."""
SLOWDOWN_AT_TOP_RATE = 0.3
"""The coarse grid's largest load slowdown, as the relative slowdown at the highest rate traced (30%)."""
SLOWDOWN_POINTS = 11
"""Coarse slowdowns searched, evenly from 0 to SLOWDOWN_AT_TOP_RATE."""
SCALE_FINE_STEP = 0.005
"""Step of the fine scale grid, which spans 3 steps either side of the coarse best."""
SLOWDOWN_FINE_DIVISIONS = 3
"""The fine slowdown grid's step is the coarse one's divided by this; it spans 3 steps either side."""
FINE_SPAN = 3
"""Fine-grid points either side of the coarse best, in each dimension (so 7 x 7 = 49 points)."""
ADMISSION_GRID_S = tuple(0.001 * i for i in range(21))
"""Coarse admission delays per running sequence searched: 0 to 20 ms."""
ADMISSION_FINE_STEP_S = 0.0001
"""Step of the fine admission-delay grid, which spans 10 steps either side of the coarse best."""
ADMISSION_FINE_SPAN = 10
"""Fine admission-delay points either side of the coarse best."""


def _misfit(
    setup: SimSetup, model: LatencyModel, runs: Sequence[TracedRun], metric: Callable[[RequestRecord], float]
) -> float:
    """Sum over the runs of the squared relative error of the simulated mean of `metric` against the measured
    one (each run counts equally, so a light run is matched as well as a busy one)."""
    total = 0.0
    for run in runs:
        target = statistics.fmean(metric(r) for r in run.records if r.ok)
        simulated = [metric(r) for r in simulate(setup, model, run.specs, seed=0, jitter=False).records if r.ok]
        total += ((statistics.fmean(simulated) - target) / target) ** 2 if simulated else 1.0
    return total


def with_admission_delay(model: LatencyModel, delay_s: float) -> LatencyModel:
    """`model` with the given admission delay per running sequence."""
    return replace(model, overheads=replace(model.overheads, admission_delay_per_running_s=delay_s))


def fit_admission_delay(model: LatencyModel, setup: SimSetup, runs: Sequence[TracedRun]) -> float:
    """Seconds of admission delay per running sequence that best match the traced runs' mean TTFT.

    Each run counts equally (squared relative error of its simulated mean TTFT against the measured one),
    so a light run is matched as well as a busy one. ADMISSION_GRID_S, then the fine grid around its best.
    """
    runs = [run for run in runs if any(r.ok for r in run.records)]
    if not runs:
        return 0.0

    def loss(delay: float) -> float:
        return _misfit(setup, with_admission_delay(model, delay), runs, lambda r: r.ttft)

    best = min(ADMISSION_GRID_S, key=loss)
    span = range(-ADMISSION_FINE_SPAN, ADMISSION_FINE_SPAN + 1)
    return min((max(0.0, best + ADMISSION_FINE_STEP_S * i) for i in span), key=loss)


def scaled_steps(model: LatencyModel, scale: float, slowdown: float) -> LatencyModel:
    """`model` with every step-time term multiplied by `scale` and the given load slowdown."""
    o = model.overheads
    overheads = replace(
        o,
        arrival_s=o.arrival_s * scale,
        completion_s=o.completion_s * scale,
        serving_work_s=o.serving_work_s * scale,
        load_slowdown_per_rps=slowdown,
    )
    return replace(model, steps=model.steps.scaled(scale), overheads=overheads)


def fit_load_response(
    model: LatencyModel, setup: SimSetup, runs: Sequence[TracedRun], *, slowdown: bool = True
) -> tuple[float, float]:
    """(scale of the step times, load slowdown per request/s) that best match the traced runs' mean
    end-to-end latency in simulation (see ServingOverheads.load_slowdown_per_rps).

    The step coefficients were fitted on steps of every traced load at once, so they carry the average
    load's slowdown; the scale takes it back out where the slowdown puts it per step. Each run counts
    equally (squared relative error of its simulated mean against the measured one); near capacity a few
    percent of step time moves latency by tens of percent, so the busiest run pins the slowdown down.
    SCALE_GRID x SLOWDOWN_POINTS, then the fine grid around the best point: 203 simulations of each run.
    Without `slowdown` only the scale is searched (the slowdown stays 0): 21 simulations of each run.
    """
    runs = [run for run in runs if any(r.ok for r in run.records) and run.rate_rps > 0]
    if not runs:
        return 1.0, 0.0
    unit = SLOWDOWN_AT_TOP_RATE / max(run.rate_rps for run in runs) / (SLOWDOWN_POINTS - 1)
    coarse, fine = (range(SLOWDOWN_POINTS), range(-FINE_SPAN, FINE_SPAN + 1)) if slowdown else (range(1), range(1))

    def loss(point: tuple[float, float]) -> float:
        return _misfit(setup, scaled_steps(model, *point), runs, lambda r: r.e2el)

    scale, per_rps = min(((s, unit * k) for s in SCALE_GRID for k in coarse), key=loss)
    finer = (
        (scale + SCALE_FINE_STEP * i, max(0.0, per_rps + unit * k / SLOWDOWN_FINE_DIVISIONS))
        for i in range(-FINE_SPAN, FINE_SPAN + 1)
        for k in fine
    )
    return min(finer, key=loss)


def traced_run_fit(model: LatencyModel, setup: SimSetup, runs: Sequence[TracedRun]) -> tuple[TracedRunFit, ...]:
    """How the fitted model reproduces each traced run: rate, requests, measured and simulated mean TTFT and
    end-to-end latency (ms); a run with no completed request has no row."""
    rows = []
    for run in runs:
        measured = [r for r in run.records if r.ok]
        simulated = [r for r in simulate(setup, model, run.specs, seed=0, jitter=False).records if r.ok]
        if not measured or not simulated:
            continue
        rows.append(
            TracedRunFit(
                rate_rps=run.rate_rps,
                requests=len(run.specs),
                measured_mean_ttft_ms=1000 * statistics.fmean(r.ttft for r in measured),
                simulated_mean_ttft_ms=1000 * statistics.fmean(r.ttft for r in simulated),
                measured_mean_e2el_ms=1000 * statistics.fmean(r.e2el for r in measured),
                simulated_mean_e2el_ms=1000 * statistics.fmean(r.e2el for r in simulated),
            )
        )
    return tuple(rows)


def match_load_response(
    model: LatencyModel, setup: SimSetup, runs: Sequence[TracedRun], *, slowdown: bool = True
) -> LatencyModel:
    """Stage 4: a new model whose step scale and load slowdown (unless not `slowdown`) make the simulated `runs`
    match end to end."""
    scale, per_rps = fit_load_response(model, setup, runs, slowdown=slowdown)
    scaled = scaled_steps(model, scale, per_rps)
    return replace(scaled, fit=replace(scaled.fit, step_scale_under_load=scale))


def match_admission_delay(model: LatencyModel, setup: SimSetup, runs: Sequence[TracedRun]) -> LatencyModel:
    """Stage 5: a new model whose admission delay per running sequence makes the simulated `runs`' TTFT match."""
    return with_admission_delay(model, fit_admission_delay(model, setup, runs))
