"""Stage 3 of `gate profile`: the manifest's server under open-loop load, and the step model refitted on it.

The server runs its declared workload at TRACE_LOADS of the capacity the stage-2 model predicts, with the
step trace on (runtime/engine/step_trace.py). Under load a step costs more than the bare model step: sampling and
streaming for every sequence, and the HTTP work of arriving and finishing requests, share the interpreter
with the engine; so the step coefficients and the costs of admitting and of answering a request during a
step are refitted on the steps the server actually ran (step_fit.fit_serving_steps).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from servegate.capacity.bench.load_generator import run_open_loop
from servegate.capacity.bench.own_server import against_server
from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.bench.targets import PromptFactory
from servegate.capacity.bench.workload import RequestSpec, make_requests, with_rate
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.step_fit import ServingStep, fit_serving_steps
from servegate.capacity.latency.terms import StepJitter
from servegate.contracts.capacity_section import Workload
from servegate.contracts.manifest import ServedModel

BACK_TO_BACK_S = 0.002
"""Steps closer than this (seconds) ran one after the other with no idle wait between them."""


def serving_steps(records: Sequence[dict[str, Any]]) -> list[ServingStep]:
    """The steps of a step trace (runtime/engine/step_trace.py) as fitting samples."""
    steps = []
    for i, r in enumerate(records):
        if not (r["ended"] > r["began"] and r["chunks"]):
            continue
        before = records[i - 1] if i else None
        at_once = before is not None and 0 <= r["began"] - before["ended"] < BACK_TO_BACK_S
        steps.append(
            ServingStep(
                tuple((int(n), int(start)) for n, start in r["chunks"]),
                r["ended"] - r["began"],
                r["arrivals"],
                began=r["began"],
                ended=r["ended"],
                after_completed=int(before.get("completed", 0)) if at_once and before is not None else 0,
            )
        )
    return steps


def refit_on_serving(
    model: LatencyModel, steps: Sequence[ServingStep], single: Sequence[RequestRecord], batch_wait_s: float = 0.0
) -> LatencyModel:
    """The latency model refitted on steps the server ran under open-loop load.

    Step coefficients and the per-admission and per-answer costs come from the serving steps
    (fit_serving_steps); the request overhead is re-derived from the single requests against the new
    prefill prediction; the finishing overhead is kept. The step jitter becomes the spread of serving
    steps around the fit.
    """
    fitted = fit_serving_steps(steps)
    refit = replace(
        model,
        steps=fitted.steps,
        overheads=replace(model.overheads, arrival_s=fitted.admission_s, completion_s=fitted.completion_s),
        fit=replace(model.fit, serving_steps=fitted.error, serving_mean_step_s=fitted.mean_step_s),
    )
    request_s = request_overhead(refit, [r for r in single if r.ok and r.token_times], batch_wait_s)
    ratios = np.array([s.seconds / max(fitted.step_seconds(s), 1e-9) for s in steps])
    jitter = StepJitter(
        spread=float(np.std(ratios) / max(np.mean(ratios), 1e-9)),
        correlation=_lag1_correlation(np.log(np.maximum(ratios, 1e-9)), steps),
    )
    return replace(refit, overheads=replace(refit.overheads, request_s=request_s), jitter=jitter)


def _lag1_correlation(log_ratios: np.ndarray, steps: Sequence[ServingStep]) -> float:
    """Correlation of consecutive back-to-back steps' log slowdowns (0 when too few or undefined)."""
    pairs = [
        (log_ratios[i], log_ratios[i + 1])
        for i, (step, following) in enumerate(pairwise(steps))
        if step.ended is not None and following.began is not None and 0 <= following.began - step.ended < BACK_TO_BACK_S
    ]
    if len(pairs) < 10:
        return 0.0
    a, b = np.array(pairs).T
    if a.std() == 0 or b.std() == 0:
        return 0.0
    return float(max(0.0, np.corrcoef(a, b)[0, 1]))


def request_overhead(model: LatencyModel, single: Sequence[RequestRecord], batch_wait_s: float) -> float:
    """Median TTFT of lone requests beyond their batching wait and predicted prefill step, seconds."""
    extra = [r.ttft - batch_wait_s - model.prefill_time(max(2, r.prompt_tokens)) for r in single]
    return max(0.0, statistics.median(extra)) if extra else 0.0


def tracing_variant(served: ServedModel) -> ServedModel:
    """The manifest under continuous batching with no window, whose steps cover every mix of work.

    Its caches stay as declared: looking up and filling them costs time on every request even when,
    as with the bench's fresh prompts, nothing hits.
    """
    batching = {
        "mode": "continuous",
        "max_batch_size": max(8, served.batching.max_batch_size),
        "max_wait_ms": 0.0,
        "max_num_batched_tokens": served.batching.max_num_batched_tokens,
        "chunked_prefill": served.batching.chunked_prefill,
    }
    return served.with_changes(batching=batching)


TRACE_LOADS = (0.05, 0.3, 0.5, 0.7, 1.1)
"""Open-loop rates, as fractions of the predicted capacity, at which serving steps are traced. The end-to-end
fit matches the runs below capacity; three of them between a third and most of capacity pin down how fast
latency rises there (with 0.05, 0.3 and 0.7 alone, near-knee predictions came out 8% low on average)."""
TRACE_SECONDS = 3.0
"""Seconds of arrivals sent at each traced rate, within TRACE_REQUESTS."""
TRACE_REQUESTS = (30, 300)
"""Fewest and most requests sent at each traced rate (the most: as many as planner_accuracy.py sends per load,
so that the busiest run is as long as the runs it predicts)."""


@dataclass
class TracedRun:
    """One open-loop run of the trace stage: what was sent and what the client measured."""

    specs: list[RequestSpec]
    records: list[RequestRecord]
    rate_rps: float = 0.0
    """The open-loop arrival rate it was sent at, requests/s."""
    began_at: float = 0.0
    """Wall-clock time (time.time()) it started."""
    ended_at: float = 0.0
    """Wall-clock time its last request ended."""


def trace_serving(
    served: ServedModel, model: LatencyModel, shape: Workload, prompts: PromptFactory, trace: Path
) -> tuple[list[ServingStep], list[TracedRun], float]:
    """Serve open-loop traffic of `shape` at TRACE_LOADS of the predicted capacity: the steps the engine
    ran, the runs as the client saw them, and then the p50 end-to-end latency (ms) of the speed check's
    lone requests (speed_check.py), the reference that check compares later measurements with."""
    from servegate.capacity.bench.load_generator import run_once
    from servegate.capacity.bench.local_server import LocalServer
    from servegate.capacity.latency.prediction import saturation_throughput, sim_setup
    from servegate.capacity.latency.speed_check import lone_workload
    from servegate.runtime.engine.step_trace import read_step_trace

    variant = tracing_variant(served)
    capacity = saturation_throughput(sim_setup(variant), model, shape)
    runs: list[TracedRun] = []
    with LocalServer(variant, step_trace=trace) as server:
        for i, factor in enumerate(TRACE_LOADS):
            rate = factor * capacity
            count = int(min(TRACE_REQUESTS[1], max(TRACE_REQUESTS[0], rate * TRACE_SECONDS)))
            workload = with_rate(shape, rate).model_copy(update={"num_requests": count})
            specs = make_requests(workload, seed=11 + i)
            began = time.time()
            records = against_server(server.url, served, partial(run_open_loop, specs=specs, prompts=prompts))
            runs.append(TracedRun(specs, records, rate, began_at=began, ended_at=time.time()))
        steps = serving_steps(read_step_trace(trace))  # read now: the lone requests' steps stay out of the fit
        lone = against_server(server.url, served, lambda t: run_once(t, lone_workload(shape), prompts, seed=0))
    return steps, runs, float(lone.summary["e2el_ms"]["p50"])
