"""The planner's error taken apart: the simulator with measured steps, and the step model against measured steps.

A bench run against a server with its step trace on (runtime/engine/step_trace.py) measures two things at once:
what every request saw, and how long every engine step took. Replaying the measured step durations through
the simulator, with the run's own requests and arrival times, leaves only the scheduling and queueing model
to be wrong (`replay_run`): the machine's speed is in the durations. When the trace also records when the engine
admitted each request (traces since 2026-12-02), each request's measured way in (client send -> engine admission,
`admission_delays`) replaces the model's request overhead and admission delay, so the HTTP front is taken out too
and only the scheduler and the queue are left. When it also records when the engine handed each request's first token
and final event to its sink, each request's measured way out (engine handoff -> client receipt, `way_out_delays`)
is added to the simulated first token and end in place of the model's finish overhead. Comparing the fitted step
model with the same measured steps (`step_cost_errors`) says how wrong the step times alone are, per kind of step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.bench.workload import RequestSpec
from servegate.capacity.latency.load_fit import scaled_steps
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.serving_trace import BACK_TO_BACK_S
from servegate.capacity.latency.simulate import SimResult, SimSetup, simulate
from servegate.capacity.latency.step_fit import ServingStep
from servegate.capacity.latency.terms import Chunk

STEP_KINDS = ("prefill", "decode", "mixed")
"""Kinds of step: prompts only, decodes only, both in one step."""


def step_kind(chunks: Iterable[Chunk]) -> str:
    """`prefill` (only prompt chunks), `decode` (only one-token chunks) or `mixed`."""
    sizes = [n for n, _ in chunks]
    prefill = any(n > 1 for n in sizes)
    decode = any(n == 1 for n in sizes)
    return "mixed" if prefill and decode else "prefill" if prefill else "decode"


def run_window(records: Sequence[RequestRecord]) -> tuple[float, float]:
    """(first scheduled send, last response end) of a run on the perf_counter clock its server traces with."""
    ends = [r.end for r in records if r.end is not None]
    return min(r.scheduled for r in records), max(ends) if ends else max(r.scheduled for r in records)


def steps_in(trace: Sequence[dict[str, Any]], began: float, ended: float) -> list[dict[str, Any]]:
    """The traced steps that began within [began, ended] (one run's steps out of a server's whole trace)."""
    return [r for r in trace if began <= r["began"] <= ended and r["ended"] > r["began"] and r["chunks"]]


def replay_durations(steps: Sequence[dict[str, Any]]) -> list[float]:
    """Each traced step's duration as the simulator replays it: from its start to the next step's start when
    that one followed at once (the engine's work between steps counts), else to its own end."""
    out = []
    for i, step in enumerate(steps):
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        gap = nxt["began"] - step["ended"] if nxt is not None else None
        end = nxt["began"] if nxt is not None and gap is not None and 0 <= gap < BACK_TO_BACK_S else step["ended"]
        out.append(end - step["began"])
    return out


def specs_of_run(specs: Sequence[RequestSpec], records: Sequence[RequestRecord]) -> list[RequestSpec]:
    """The run's requests with the arrival times the client scheduled them at (seconds from the first)."""
    first = min(r.scheduled for r in records)
    return [
        RequestSpec(s.prompt_tokens, s.output_tokens, r.scheduled - first) for s, r in zip(specs, records, strict=True)
    ]


def admission_delays(records: Sequence[RequestRecord], admissions: Sequence[dict[str, Any]]) -> list[float | None]:
    """Per record, seconds from its scheduled send to the engine's admission (or refusal) of it, found in the
    trace's admissions by the id the server answered with (None: no id, or the trace has none for it).

    The bench's client and the server it starts are two processes, each stamping with time.perf_counter:
    on Linux CPython reads clock_gettime(CLOCK_MONOTONIC) for it, one clock for the whole machine, so the two
    are comparable (checked: a child process's reading falls between its parent's readings just before and
    after it ran). The server must run on the client's machine, as LocalServer's does.
    """
    at = {a["request"]: a.get("admitted", a.get("refused")) for a in admissions}
    out: list[float | None] = []
    for r in records:
        t = at.get(r.request_id) if r.request_id is not None else None
        out.append(None if t is None else t - r.scheduled)
    return out


def way_out_delays(
    records: Sequence[RequestRecord], handoffs: Sequence[dict[str, Any]]
) -> list[tuple[float | None, float | None]]:
    """Per record, (client's first token - engine's first-token handoff, client's end - engine's final handoff)
    in seconds, found in the trace's handoffs by the id the server answered with (None where either side is
    missing). The clocks are comparable as in `admission_delays`."""
    first = {h["request"]: h["first_token"] for h in handoffs if "first_token" in h}
    final = {h["request"]: h["finished"] for h in handoffs if "finished" in h}
    out: list[tuple[float | None, float | None]] = []
    for r in records:
        f = first.get(r.request_id) if r.request_id is not None and r.token_times else None
        e = final.get(r.request_id) if r.request_id is not None and r.end is not None else None
        out.append((None if f is None else r.token_times[0] - f, None if e is None or r.end is None else r.end - e))
    return out


def replay_run(
    setup: SimSetup,
    model: LatencyModel,
    specs: Sequence[RequestSpec],
    durations: Sequence[float],
    delays: Sequence[float | None] | None = None,
    way_out: Sequence[tuple[float | None, float | None]] | None = None,
) -> SimResult:
    """Simulate `specs` with every step lasting what was measured (the k-th step, the k-th duration) and, given
    `delays` (`admission_delays`), every request reaching the scheduler when it was measured to, and given
    `way_out` (`way_out_delays`), its tokens and end reaching the client as late after the engine as measured; the
    model gives only what was not measured: any step beyond the measured ones, a request's way in or out."""
    return simulate(
        setup, model, specs, seed=0, jitter=False, replay=durations, admission_delays=delays, way_out=way_out
    )


def predicted_step_seconds(model: LatencyModel, step: ServingStep) -> float:
    """What the latency model predicts for a traced step: its chunks, and the requests admitted and answered
    around it."""
    o = model.overheads
    extra = o.arrival_s * step.arrivals + o.completion_s * step.after_completed
    return model.step_time(step.chunks) + extra


def step_cost_errors(model: LatencyModel, steps: Sequence[ServingStep]) -> dict[str, dict[str, float]]:
    """Per kind of step (and `all`): steps, median and p90 relative error of predicted against measured
    duration, and the mean signed error (above 0: the model predicts slower steps than were measured)."""
    groups: dict[str, list[float]] = {kind: [] for kind in (*STEP_KINDS, "all")}
    for step in steps:
        if step.seconds <= 0:
            continue
        err = (predicted_step_seconds(model, step) - step.seconds) / step.seconds
        groups[step_kind(step.chunks)].append(err)
        groups["all"].append(err)
    out: dict[str, dict[str, float]] = {}
    for kind, errs in groups.items():
        if errs:
            a = np.abs(errs)
            out[kind] = {
                "steps": len(errs),
                "median_rel_error": float(np.median(a)),
                "p90_rel_error": float(np.percentile(a, 90)),
                "mean_signed_error": float(np.mean(errs)),
            }
    return out


def at_speed(model: LatencyModel, factor: float) -> LatencyModel:
    """`model` on a machine `factor` times slower (above 1) or faster: every time it predicts scaled, the
    load slowdown (a relative figure) kept."""
    scaled = scaled_steps(model, factor, model.overheads.load_slowdown_per_rps)
    o = scaled.overheads
    overheads = replace(
        o,
        request_s=o.request_s * factor,
        finish_s=o.finish_s * factor,
        admission_delay_per_running_s=o.admission_delay_per_running_s * factor,
    )
    return replace(scaled, overheads=overheads)
