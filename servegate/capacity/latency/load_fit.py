"""The last fit of `gate profile`: the traced runs simulated end to end, and the few numbers that make them match.

Near capacity a few percent of step time moves latency by tens of percent, so after the step coefficients
are refitted on the traced steps (serving_trace.py), the runs below capacity are simulated and two numbers
are chosen so that their mean end-to-end latency matches: a scale of the step times and a slowdown per
request/s sent (what a busier server takes from the engine beyond the per-request costs); then the
admission delay per running sequence that matches their TTFT.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.serving_trace import TracedRun
from servegate.capacity.latency.simulate import SimSetup, simulate


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


def fit_admission_delay(model: LatencyModel, setup: SimSetup, runs: Sequence[TracedRun]) -> float:
    """Seconds of admission delay per running sequence that best match the traced runs' mean TTFT.

    Each run counts equally (squared relative error of its simulated mean TTFT against the measured one),
    so a light run is matched as well as a busy one. A scan over 0-20 ms, then a finer one around the best.
    """
    runs = [run for run in runs if any(r.ok for r in run.records)]
    if not runs:
        return 0.0

    def loss(delay: float) -> float:
        trial = LatencyModel(**{**model.__dict__, "admission_delay_per_running_s": delay})
        return _misfit(setup, trial, runs, lambda r: r.ttft)

    best = min((0.001 * i for i in range(21)), key=loss)
    return min((max(0.0, best + 0.0001 * i) for i in range(-10, 11)), key=loss)


def scaled_steps(model: LatencyModel, scale: float, slowdown: float) -> LatencyModel:
    """`model` with every step-time term multiplied by `scale` and the given load slowdown."""
    return LatencyModel(
        **{
            **model.__dict__,
            "coefficients": {name: value * scale for name, value in model.coefficients.items()},
            "arrival_overhead_s": model.arrival_overhead_s * scale,
            "completion_overhead_s": model.completion_overhead_s * scale,
            "load_slowdown_per_rps": slowdown,
        }
    )


def fit_load_response(model: LatencyModel, setup: SimSetup, runs: Sequence[TracedRun]) -> tuple[float, float]:
    """(scale of the step times, load slowdown per request/s) that best match the traced runs' mean
    end-to-end latency in simulation (see LatencyModel.load_slowdown_per_rps).

    The step coefficients were fitted on steps of every traced load at once, so they carry the average
    load's slowdown; the scale takes it back out where the slowdown puts it per step. Each run counts
    equally (squared relative error of its simulated mean against the measured one); near capacity a few
    percent of step time moves latency by tens of percent, so the busiest run pins the slowdown down.
    A coarse grid (scale 0.8-1.19, slowdown up to 30% at the highest rate traced), then a finer one
    around the best point: 203 simulations of each run.
    """
    runs = [run for run in runs if any(r.ok for r in run.records) and run.rate_rps > 0]
    if not runs:
        return 1.0, 0.0
    unit = 0.3 / max(run.rate_rps for run in runs) / 10

    def loss(point: tuple[float, float]) -> float:
        return _misfit(setup, scaled_steps(model, *point), runs, lambda r: r.e2el)

    scale, slowdown = min(((0.8 + 0.03 * i, unit * k) for i in range(14) for k in range(11)), key=loss)
    finer = ((scale + 0.005 * i, max(0.0, slowdown + unit * k / 3)) for i in range(-3, 4) for k in range(-3, 4))
    return min(finer, key=loss)


def traced_run_fit(model: LatencyModel, setup: SimSetup, runs: Sequence[TracedRun]) -> list[dict[str, float]]:
    """How the fitted model reproduces each traced run: rate, requests, measured and simulated mean TTFT and
    end-to-end latency (ms)."""
    rows = []
    for run in runs:
        measured = [r for r in run.records if r.ok]
        simulated = [r for r in simulate(setup, model, run.specs, seed=0, jitter=False).records if r.ok]
        if not measured or not simulated:
            continue
        rows.append(
            {
                "rate_rps": run.rate_rps,
                "requests": len(run.specs),
                "measured_mean_ttft_ms": 1000 * statistics.fmean(r.ttft for r in measured),
                "simulated_mean_ttft_ms": 1000 * statistics.fmean(r.ttft for r in simulated),
                "measured_mean_e2el_ms": 1000 * statistics.fmean(r.e2el for r in measured),
                "simulated_mean_e2el_ms": 1000 * statistics.fmean(r.e2el for r in simulated),
            }
        )
    return rows
