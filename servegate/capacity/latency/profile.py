"""`gate profile`: measure this machine's step times and fit the latency model, in five named stages.

Each stage is a function that takes the model so far and returns a new one (dataclasses.replace):

1. Model steps (`fit_model_steps`): the runtime's model runner executes hand-built steps over its paged
   KV pool (step_timing.step_grid); the step cost is fitted by non-negative least squares on relative error.
2. Serving overheads (`calibration.calibrate`): lone requests and bursts through the manifest's own
   server; the inter-token gaps beyond the predicted decode step become per-step and per-sequence costs,
   TTFT beyond the prefill step the request overhead, the tail after the last token the finish overhead.
3. Serving steps (`serving_trace.refit_on_serving`): the server runs open-loop traffic of the declared
   workload at TRACE_LOADS of the capacity stage 2 predicts, with a step trace on; the step cost and the
   per-admission and per-answer costs are refitted on the steps it ran (least squares on absolute error).
4. Load response (`load_fit.match_load_response`): the traced runs below capacity are simulated and the
   step scale and load slowdown chosen so that their mean end-to-end latency matches.
5. Admission delay (`load_fit.match_admission_delay`): the delay per running sequence that matches their TTFT.

`http_terms="one"` (benchmarks/planner_accuracy.py --http-terms one) fits the variant where the CPU that HTTP
work takes from the engine is the per-admission cost of stage 3 alone: stage 4 fits the step scale only,
stage 5 is skipped (load slowdown and admission delay stay 0).

Last, `with_provenance` records what was profiled, where and when, and how the final model reproduces
each traced run. This machine's speed is sampled throughout (machine_speed.py), so the profile says how
fast the machine ran and whether it held still. docs/latency-model.md lists every term and its stage.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from servegate.capacity.bench.machine_speed import MachineSpeedMonitor
from servegate.capacity.bench.own_server import against_server
from servegate.capacity.bench.targets import PromptFactory
from servegate.capacity.latency.calibration import (
    CALIBRATION_BURST,
    CALIBRATION_OUTPUT_TOKENS,
    CalibrationRuns,
    calibrate,
    measure_serving,
)
from servegate.capacity.latency.load_fit import match_admission_delay, match_load_response, traced_run_fit
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.provenance import FitQuality, LoneReference, Provenance, hardware_id
from servegate.capacity.latency.serving_trace import (
    TRACE_LOADS,
    TracedRun,
    refit_on_serving,
    trace_serving,
    tracing_variant,
)
from servegate.capacity.latency.step_fit import fit_steps, residual_spread
from servegate.capacity.latency.step_timing import PROFILE_BATCH, ProfileLimits, Tick, step_grid, time_steps
from servegate.capacity.latency.terms import StepJitter, StepSample
from servegate.contracts.capacity_section import LengthDistribution, Workload
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel

if TYPE_CHECKING:
    from servegate.runtime.model.model_runner import PagedModelRunner

PROFILING_WAIT_MS = 50.0
"""Batching window of the calibration server, so that a burst's requests are batched together."""
TRACE_WARMUP_STEPS = 3
"""Traced steps left out of the serving-step fit (the first ones pay for warming the server up)."""
DEFAULT_TRACE_REQUESTS = 48
"""Requests of the traced workload when the manifest declares none (capacity.workload)."""

HttpTerms = Literal["three", "one"]
"""The terms that model HTTP work taking CPU from the engine: arrival cost, load slowdown and admission delay
("three"), or the arrival cost alone ("one")."""

Stage = Callable[[str, int], None]
"""Told each stage's name and how many ticks it will take (0: unknown)."""


def fit_model_steps(samples: Sequence[StepSample]) -> LatencyModel:
    """Stage 1: a latency model of model steps alone (no serving overheads yet)."""
    steps, error = fit_steps(samples)
    return LatencyModel(
        steps,
        jitter=StepJitter(spread=residual_spread(steps, samples)),
        fit=FitQuality(model_steps=error, step_samples=tuple(samples)),
    )


def with_provenance(
    model: LatencyModel, served: ServedModel, traced: Sequence[TracedRun], lone: LoneReference | None
) -> LatencyModel:
    """The last step: what was profiled, where and when, and how the final model reproduces the traced runs."""
    from servegate.capacity.latency.prediction import profile_key, sim_setup

    provenance = Provenance(
        key=profile_key(served),
        fingerprint=served.fingerprint,
        hardware=hardware_id(),
        profiled_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        load_average_1m=os.getloadavg()[0],  # other work on the machine while it was measured
    )
    fit = replace(
        model.fit,
        traced_rates_rps=tuple(run.rate_rps for run in traced),
        traced_runs=traced_run_fit(model, sim_setup(tracing_variant(served)), traced),
        lone_reference=lone,
    )
    return replace(model, provenance=provenance, fit=fit)


def profiling_variant(served: ServedModel, max_batch_size: int) -> ServedModel:
    """The manifest with request-level batching of `max_batch_size` and no caches, for measuring."""
    runtime = served.runtime.model_dump(mode="python")
    if runtime.get("kv_cache") is not None:
        runtime["kv_cache"] = {**runtime["kv_cache"], "prefix_caching": False}
    post = served.postprocess.model_dump(mode="python")
    post["response_cache"] = {**post["response_cache"], "enabled": False}
    batching = {"mode": "dynamic", "max_batch_size": max_batch_size, "max_wait_ms": PROFILING_WAIT_MS}
    return served.with_changes(batching=batching, runtime=runtime, postprocess=post)


def _max_rss_bytes() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def profile_manifest(
    served: ServedModel,
    *,
    repeats: int = 5,
    burst: int = CALIBRATION_BURST,
    tick: Tick | None = None,
    stage: Stage | None = None,
    http_terms: HttpTerms = "three",
) -> LatencyModel:
    """Measure model steps in this process, then serving overheads through the manifest's own server.

    This machine's speed is sampled meanwhile: `fit.machine_speed` is how fast it ran during the traced runs
    (what the last fits matched), `fit.machine_speed_profile` over the whole profile (machine_speed.py).
    """
    if served.runtime.remote:
        raise ServegateError("gate profile measures the reference runtime; an endpoint is measured with gate bench")
    with MachineSpeedMonitor() as monitor:
        model, traced = _profile(served, repeats, burst, tick, stage, http_terms)
        traced_speed = monitor.summary(traced[0].began_at, traced[-1].ended_at) if traced else None
        by_rate = {run.rate_rps: monitor.summary(run.began_at, run.ended_at) for run in traced}
    rows = tuple(
        replace(row, probe_us=speed.probe_us) if (speed := by_rate.get(row.rate_rps)) is not None else row
        for row in model.fit.traced_runs
    )
    fit = replace(model.fit, traced_runs=rows, machine_speed=traced_speed, machine_speed_profile=monitor.summary())
    return replace(model, fit=fit)


def _model_steps(served: ServedModel, repeats: int, tick: Tick | None, stage: Stage | None) -> tuple[LatencyModel, Any]:
    """Stage 1 on this process's runner: the model, with the memory the process held beyond weights and KV pool,
    and the manifest's tokenizer."""
    from servegate.capacity.memory.plan import manifest_memory
    from servegate.runtime.engine.parts import build_parts

    if served.runtime.threads:
        import torch

        torch.set_num_threads(served.runtime.threads)
    variant = profiling_variant(served, PROFILE_BATCH)
    parts = build_parts(variant)
    # a generate-task variant always gets the paged runner (None is for task: embed)
    runner = cast("PagedModelRunner", parts.runner)
    limits = ProfileLimits(
        max_prompt_tokens=served.preprocess.max_input_tokens,
        max_batch_size=PROFILE_BATCH,
        max_num_batched_tokens=max(served.batching.max_num_batched_tokens, 4 * served.preprocess.max_input_tokens),
        max_context=served.runtime.max_model_len,
    )
    grid = step_grid(limits, runner.num_blocks, runner.block_size)
    if stage:
        stage("timing model steps", len(grid))
    model = fit_model_steps(time_steps(runner, grid, repeats, tick))
    # everything the process holds beyond weights and KV pool: interpreter, torch, activations of the largest step
    kv_pool = runner.num_blocks * runner.block_size * runner.bytes_per_token()
    overhead = max(0, _max_rss_bytes() - manifest_memory(variant).weights_bytes - kv_pool)
    return replace(model, runtime_overhead_bytes=overhead), parts.tokenizer


def _traced_shape(served: ServedModel, prompt_lengths: Sequence[int], output: int) -> Workload:
    """The workload stage 3 traces: the manifest's own, or one of the calibration's lengths."""
    return served.capacity.workload or Workload(
        input_tokens=LengthDistribution(distribution="uniform", mean=sum(prompt_lengths) // 2, min=2,
                                        max=max(prompt_lengths)),
        output_tokens=LengthDistribution(mean=output, max=output),
        rate_rps=1.0,
        num_requests=DEFAULT_TRACE_REQUESTS,
    )  # fmt: skip


def _profile(
    served: ServedModel, repeats: int, burst: int, tick: Tick | None, stage: Stage | None, http_terms: HttpTerms
) -> tuple[LatencyModel, list[TracedRun]]:
    """The five stages: the fitted model and the runs traced in stage 3."""
    from servegate.capacity.bench.local_server import LocalServer
    from servegate.capacity.latency.prediction import sim_setup
    from servegate.capacity.latency.speed_check import lone_workload, predicted_lone_e2e_ms

    model, tokenizer = _model_steps(served, repeats, tick, stage)
    if stage:
        stage("measuring serving overheads", 0)
    prompt_lengths = sorted({max(2, served.preprocess.max_input_tokens // 4), served.preprocess.max_input_tokens})
    output = max(2, min(CALIBRATION_OUTPUT_TOKENS, served.postprocess.max_output_tokens))
    prompts = PromptFactory(tokenizer)
    calibration = profiling_variant(served, burst)
    wait_s = calibration.batching.max_wait_ms / 1000
    with LocalServer(calibration) as server:
        runs: CalibrationRuns = against_server(
            server.url, served, lambda t: measure_serving(t, prompts, prompt_lengths, burst, output)
        )
    model = calibrate(model, runs, wait_s)
    if stage:
        stage("tracing serving steps under load", 0)
    shape = _traced_shape(served, prompt_lengths, output)
    with tempfile.TemporaryDirectory(prefix="servegate-trace-") as tmp:
        steps, traced, lone_ms = trace_serving(served, model, shape, prompts, Path(tmp) / "steps.jsonl")
    try:
        model = refit_on_serving(model, steps[TRACE_WARMUP_STEPS:], runs.single, wait_s)
    except ValueError as exc:
        raise ServegateError(f"too few serving steps were traced to fit the latency model: {exc}") from None
    below = [run for run, factor in zip(traced, TRACE_LOADS, strict=True) if factor < 1]  # queueing aside
    traced_setup = sim_setup(tracing_variant(served))
    model = match_load_response(model, traced_setup, below, slowdown=http_terms == "three")
    if http_terms == "three":
        model = match_admission_delay(model, traced_setup, below)
    lone = lone_workload(shape)
    predicted = predicted_lone_e2e_ms(tracing_variant(served), model, lone)
    return with_provenance(model, served, traced, LoneReference(lone.num_requests, lone_ms, predicted)), traced
