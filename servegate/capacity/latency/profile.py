"""`gate profile`: measure this machine's step times and fit the latency model.

Three stages, while this machine's speed is sampled throughout (machine_speed.py) so that the profile
says how fast the machine ran and whether it held still.

1. Model steps. The runtime's model runner executes hand-built steps over its paged KV pool: prefills of
   growing prompts, decodes of growing batches at several context lengths, and mixes of the two. Each
   step is timed (median of `repeats`) and the step-time coefficients are fitted (latency_model.py).
2. Serving overheads. Requests go through the real serving path (the engine, or the HTTP server in
   front of it): one at a time, then bursts batched together. What the measured inter-token gaps exceed
   the model-step prediction by is the engine's per-step and per-sequence work (scheduling, sampling,
   detokenizing, streaming); TTFT beyond the prefill step is the per-request overhead; the gap from the
   last token to the end of the response is the finishing overhead. This model predicts capacity well
   enough to choose the loads of stage 3.
3. Serving steps under load (serving_trace.py): the manifest's server runs open-loop traffic of its
   declared workload at 0.05x-1.1x of that capacity with a step trace on, and the step coefficients and
   the costs of admitting and of answering a request during a step are refitted on the steps it ran.
   Last, the runs below capacity are simulated end to end and the step scale, the slowdown per request/s
   and the admission delay are chosen so that they match (load_fit.py).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servegate.capacity.bench.load_generator import run_open_loop
from servegate.capacity.bench.machine_speed import MachineSpeedMonitor
from servegate.capacity.bench.own_server import against_server
from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.bench.targets import BenchTarget, PromptFactory
from servegate.capacity.bench.workload import RequestSpec
from servegate.capacity.latency.load_fit import fit_admission_delay, fit_load_response, scaled_steps, traced_run_fit
from servegate.capacity.latency.model import (
    Chunk,
    LatencyModel,
    StepSample,
    fit_steps,
    hardware_id,
    residual_spread,
)
from servegate.capacity.latency.serving_trace import (
    TRACE_LOADS,
    TracedRun,
    refit_on_serving,
    request_overhead,
    trace_serving,
    tracing_variant,
)
from servegate.contracts.capacity_section import LengthDistribution, Workload
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel

Tick = Callable[[], None]


@dataclass(frozen=True)
class ProfileLimits:
    """The largest steps worth measuring for a manifest."""

    max_prompt_tokens: int
    """Longest prompt (preprocess.max_input_tokens, within the pool)."""
    max_batch_size: int
    """Most sequences in a step."""
    max_num_batched_tokens: int
    """Most tokens in a step."""
    max_context: int
    """Longest sequence (runtime.max_model_len)."""


def _geometric(lo: int, hi: int) -> list[int]:
    out, x = [], max(1, lo)
    while x < hi:
        out.append(x)
        x *= 2
    out.append(hi)
    return sorted(set(out))


def step_grid(limits: ProfileLimits, num_blocks: int, block_size: int) -> list[tuple[Chunk, ...]]:
    """The steps to time: prefills, batched prefills, decodes at several contexts, and mixes; all fit the pool."""
    cap_tokens = num_blocks * block_size
    max_prompt = max(2, min(limits.max_prompt_tokens, limits.max_num_batched_tokens, cap_tokens))
    grid: list[tuple[Chunk, ...]] = []
    prompts = _geometric(2, max_prompt)
    grid += [((n, 0),) for n in prompts]
    for n in prompts[:: max(1, len(prompts) // 3)]:  # a prefill continuing after cached tokens (chunked prefill)
        if 2 * n <= min(limits.max_context, cap_tokens):
            grid.append(((n, n),))
    batches = _geometric(1, max(1, limits.max_batch_size))
    for b in batches[1:]:
        n = min(prompts[len(prompts) // 2], limits.max_num_batched_tokens // b, (num_blocks // b) * block_size)
        if n >= 2:
            grid.append(tuple((n, 0) for _ in range(b)))
    contexts = sorted({16, max(16, limits.max_context // 4), max(16, limits.max_context // 2), limits.max_context})
    for b in batches:
        for ctx in contexts:
            if b * (-(-ctx // block_size)) <= num_blocks:
                grid.append(tuple((1, ctx - 1) for _ in range(b)))
    for b in batches:  # decodes beside one prefill
        ctx, n = contexts[1], prompts[len(prompts) // 2]
        if (b + 1) * (-(-max(ctx, n) // block_size)) <= num_blocks and n + b <= limits.max_num_batched_tokens:
            grid.append(((n, 0), *((1, ctx - 1) for _ in range(b))))
    return grid


def time_steps(
    runner: Any, grid: Sequence[tuple[Chunk, ...]], repeats: int = 5, tick: Tick | None = None
) -> list[StepSample]:
    """Execute every step of `grid` on the runner `repeats` times (after one warm-up); median seconds each."""
    from servegate.runtime.engine.interface import SeqChunk

    bs, nb = runner.block_size, runner.num_blocks
    vocab = max(2, int(runner.vocab_size))
    rng = np.random.default_rng(0)
    sync = _synchronizer(runner)
    samples: list[StepSample] = []
    for chunks in grid:
        inputs = []
        next_block = 0
        for seq_id, (n, start) in enumerate(chunks):
            blocks = -(-(start + n) // bs)
            table = tuple((next_block + i) % nb for i in range(blocks))
            next_block += blocks
            ids = tuple(int(t) for t in rng.integers(4, vocab, size=n))
            inputs.append(SeqChunk(seq_id, ids, start, table))
        runner.execute(inputs)
        sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            runner.execute(inputs)
            sync()
            times.append(time.perf_counter() - t0)
        samples.append(StepSample(tuple(chunks), statistics.median(times)))
        if tick:
            tick()
    return samples


def _synchronizer(runner: Any) -> Callable[[], None]:
    device = getattr(runner, "device", None)
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        import torch

        return torch.cuda.synchronize
    return lambda: None


def fit_runner(samples: Sequence[StepSample]) -> LatencyModel:
    """A latency model of model steps alone (no serving overheads yet)."""
    coefficients, quality = fit_steps(samples)
    model = LatencyModel(coefficients, fit=quality)
    model.step_jitter = residual_spread(model, samples)
    return model


async def measure_serving(
    target: BenchTarget,
    prompts: PromptFactory,
    prompt_tokens: Sequence[int],
    burst: int,
    output_tokens: int = 16,
    repeats: int = 5,
) -> dict[str, list[RequestRecord]]:
    """Requests through the serving path: one at a time for each prompt length, then `burst` at once."""
    single: list[RequestRecord] = []
    for _ in range(repeats):
        for p in prompt_tokens:
            single += await run_open_loop(target, [RequestSpec(p, output_tokens, 0.0)], prompts)
    bursts: dict[int, list[RequestRecord]] = {}
    for size in sorted({b for b in (2, 4, burst) if 1 < b <= burst}):
        for _ in range(max(2, repeats // 2)):
            specs = [RequestSpec(prompt_tokens[0], output_tokens, 0.0) for _ in range(size)]
            bursts.setdefault(size, []).extend(await run_open_loop(target, specs, prompts))
    return {"single": single, "bursts": bursts}


def calibrate(model: LatencyModel, runs: dict[str, Any], burst: int = 0, batch_wait_s: float = 0.0) -> LatencyModel:
    """Add the serving overheads that the measured requests show beyond the model-step prediction.

    `runs` holds "single" requests and "bursts" (batch size -> requests batched together; or one "burst"
    list of `burst` requests). The gap residual (measured minus predicted decode step) against batch size
    is fitted as a line: its intercept is the per-step overhead, its slope the per-sequence overhead.
    Means, not medians, are matched: an end-to-end latency is a sum of gaps, so occasional slow steps count
    in full. `batch_wait_s` is the batching window a lone request waited. The step jitter becomes the
    spread of measured gaps around the calibrated prediction.
    """
    single = [r for r in runs["single"] if r.ok and len(r.token_times) >= 2]
    if not single:
        raise RuntimeError("no request of the calibration run completed: cannot measure serving overheads")
    groups: dict[int, list[RequestRecord]] = {1: single}
    raw = runs.get("bursts") or ({burst: runs.get("burst", [])} if burst > 1 else {})
    for size, records in raw.items():
        done = [r for r in records if r.ok and len(r.token_times) >= 2]
        if done and size > 1:
            groups[int(size)] = done
    points = [(size, _decode_residual(model, records, size)) for size, records in sorted(groups.items())]
    if len(points) > 1:
        slope, intercept = np.polyfit([b for b, _ in points], [r for _, r in points], 1)
        e1 = max(0.0, float(slope))
        e0 = max(0.0, float(intercept) + (float(slope) - e1))  # a clipped slope moves its share to the intercept
    else:
        e1, e0 = 0.0, max(0.0, points[0][1])
    coefficients = dict(model.coefficients)
    coefficients["c_step"] += e0
    coefficients["c_decode_seq"] += e1
    coefficients["c_prefill_chunk"] += e1
    out = LatencyModel(coefficients, fit=dict(model.fit))
    out.request_overhead_s = request_overhead(out, single, batch_wait_s)
    out.finish_overhead_s = max(0.0, statistics.median([r.end - r.token_times[-1] for r in single if r.end]))
    ratios = [
        gap / out.decode_time(batch, max(2, r.prompt_tokens) + i + 1)
        for batch, records in groups.items()
        for r in records
        for i, gap in enumerate(r.itls)
    ]
    out.step_jitter = max(model.step_jitter, float(np.std(ratios) / max(np.mean(ratios), 1e-9)))
    out.fit.update(
        {
            "serving_step_overhead_s": e0,
            "serving_per_sequence_overhead_s": e1,
            "calibration_requests": sum(len(records) for records in groups.values()),
            "gap_residual_by_batch_s": {str(b): r for b, r in points},
        }
    )
    return out


def _decode_residual(model: LatencyModel, records: Sequence[RequestRecord], batch: int) -> float:
    """Mean measured inter-token gap minus the mean predicted decode step for `batch` sequences, seconds."""
    gaps, predicted = [], []
    for r in records:
        p = max(2, r.prompt_tokens)
        for i, gap in enumerate(r.itls):
            gaps.append(gap)
            predicted.append(model.decode_time(batch, p + i + 1))
    return statistics.fmean(gaps) - statistics.fmean(predicted)


PROFILE_BATCH = 64
"""Largest batch the step grid measures (the planner searches up to this)."""
CALIBRATION_BURST = 8
"""Requests batched together when measuring per-sequence serving overheads."""


def profiling_variant(served: ServedModel, max_batch_size: int) -> ServedModel:
    """The manifest with request-level batching of `max_batch_size` and no caches, for measuring."""
    runtime = served.runtime.model_dump(mode="python")
    if runtime.get("kv_cache") is not None:
        runtime["kv_cache"] = {**runtime["kv_cache"], "prefix_caching": False}
    post = served.postprocess.model_dump(mode="python")
    post["response_cache"] = {**post["response_cache"], "enabled": False}
    batching = {"mode": "dynamic", "max_batch_size": max_batch_size, "max_wait_ms": 50.0}
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
    stage: Callable[[str, int], None] | None = None,
) -> LatencyModel:
    """Measure model steps in this process, then serving overheads through the manifest's own server.

    This machine's speed is sampled meanwhile: `fit.machine_speed` is how fast it ran during the traced runs
    (what the last fit matched), `fit.machine_speed_profile` over the whole profile (machine_speed.py).
    """
    if served.runtime.backend != "reference":
        raise ServegateError("gate profile measures the reference runtime; an endpoint is measured with gate bench")
    with MachineSpeedMonitor() as monitor:
        model, traced = _profile(served, repeats, burst, tick, stage)
        traced_speed = monitor.summary(traced[0].began_at, traced[-1].ended_at) if traced else None
        by_rate = {run.rate_rps: monitor.summary(run.began_at, run.ended_at) for run in traced}
        for row in model.fit["traced_runs"]:  # a run with no completed request has no row
            if (speed := by_rate.get(row["rate_rps"])) is not None:
                row["probe_us"] = speed.probe_us
    whole = monitor.summary()
    model.fit["machine_speed"] = traced_speed.as_dict() if traced_speed is not None else None
    model.fit["machine_speed_profile"] = whole.as_dict() if whole is not None else None
    return model


def _profile(
    served: ServedModel, repeats: int, burst: int, tick: Tick | None, stage: Callable[[str, int], None] | None
) -> tuple[LatencyModel, list[TracedRun]]:
    """The three stages: the fitted model and the runs traced in stage 3."""
    from servegate.capacity.bench.local_server import LocalServer
    from servegate.capacity.latency.prediction import profile_key, sim_setup
    from servegate.capacity.latency.speed_check import lone_workload, predicted_lone_e2e_ms
    from servegate.capacity.memory.plan import manifest_memory
    from servegate.runtime.engine.parts import build_parts

    if served.runtime.threads:
        import torch

        torch.set_num_threads(served.runtime.threads)
    variant = profiling_variant(served, PROFILE_BATCH)
    parts = build_parts(variant)
    runner, tokenizer = parts.runner, parts.tokenizer
    limits = ProfileLimits(
        max_prompt_tokens=served.preprocess.max_input_tokens,
        max_batch_size=PROFILE_BATCH,
        max_num_batched_tokens=max(served.batching.max_num_batched_tokens, 4 * served.preprocess.max_input_tokens),
        max_context=served.runtime.max_model_len,
    )
    grid = step_grid(limits, runner.num_blocks, runner.block_size)
    if stage:
        stage("timing model steps", len(grid))
    samples = time_steps(runner, grid, repeats, tick)
    # everything the process holds beyond weights and KV pool: interpreter, torch, activations of the largest step
    kv_pool = runner.num_blocks * runner.block_size * runner.bytes_per_token()
    weights = manifest_memory(variant).weights_bytes
    overhead = max(0, _max_rss_bytes() - weights - kv_pool)
    model = fit_runner(samples)
    del parts, runner

    if stage:
        stage("measuring serving overheads", 0)
    prompt_lengths = sorted({max(2, served.preprocess.max_input_tokens // 4), served.preprocess.max_input_tokens})
    output = max(2, min(16, served.postprocess.max_output_tokens))

    prompts = PromptFactory(tokenizer)
    calibration = profiling_variant(served, burst)
    with LocalServer(calibration) as server:
        runs = against_server(server.url, served, lambda t: measure_serving(t, prompts, prompt_lengths, burst, output))
        model = calibrate(model, runs, burst, calibration.batching.max_wait_ms / 1000)
    if stage:
        stage("tracing serving steps under load", 0)
    shape = served.capacity.workload or Workload(
        input_tokens=LengthDistribution(distribution="uniform", mean=sum(prompt_lengths) // 2, min=2,
                                        max=max(prompt_lengths)),
        output_tokens=LengthDistribution(mean=output, max=output),
        rate_rps=1.0,
        num_requests=48,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="servegate-trace-") as tmp:
        steps, traced, lone_ms = trace_serving(served, model, shape, prompts, Path(tmp) / "steps.jsonl")
    try:
        model = refit_on_serving(model, steps[3:], runs["single"], calibration.batching.max_wait_ms / 1000)
    except ValueError as exc:
        raise ServegateError(f"too few serving steps were traced to fit the latency model: {exc}") from None
    model.fit["traced_rates_rps"] = [run.rate_rps for run in traced]
    below = [run for run, factor in zip(traced, TRACE_LOADS, strict=True) if factor < 1]  # queueing aside
    traced_setup = sim_setup(tracing_variant(served))
    scale, slowdown = fit_load_response(model, traced_setup, below)
    model = scaled_steps(model, scale, slowdown)
    model.fit["step_scale_under_load_fit"] = scale
    model.admission_delay_per_running_s = fit_admission_delay(model, traced_setup, below)
    model.fit["traced_runs"] = traced_run_fit(model, traced_setup, traced)
    lone = lone_workload(shape)
    model.fit["lone_reference"] = {
        "requests": lone.num_requests,
        "measured_e2el_p50_ms": lone_ms,
        "predicted_e2el_p50_ms": predicted_lone_e2e_ms(tracing_variant(served), model, lone),
    }
    model.runtime_overhead_bytes = overhead
    model.key = profile_key(served)
    model.fingerprint = served.fingerprint
    model.hardware = hardware_id()
    model.fit["load_average_1m"] = os.getloadavg()[0]  # other work on the machine while it was measured
    model.fit["profiled_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    model.fit["step_samples"] = [{"chunks": list(s.chunks), "seconds": s.seconds} for s in samples]
    return model, traced
