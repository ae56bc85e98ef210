"""`gate profile` of an engine servegate does not run (`runtime.backend: endpoint`, or vLLM): measured from outside.

Nothing inside the engine can be timed, so the latency model's terms are read off what a client sees, with
the engine's scheduler taken to be continuous batching under the manifest's `max_batch_size` and
`max_num_batched_tokens` (what vLLM, SGLang and TGI do):

1. TTFT against prompt length, one request at a time: TTFT(L) = overhead + c_step + c_prefill_token x L
   (+ c_prefill_attn x L^2), fitted non-negatively on the typical TTFT (10%-trimmed mean) of each length. The
   request overhead (HTTP, tokenization, the engine's hand-off) is what is left of the intercept after the
   step's fixed cost.
2. ITL against concurrency and context: bursts of B identical requests decode together, one token per
   sequence per step, so their inter-token gaps are decode steps of B sequences at a known context:
   ITL(B, s) = c_step + c_decode_seq x B + c_decode_attn x B x s, fitted on the typical steady gap of each
   burst (its first gaps, when prefills of later arrivals share the step, are left out). A context term is
   kept only when the points clearly need it (CURVATURE_GAIN).
3. The knee, by an open-loop rate search from the capacity the fitted model predicts (at most 1 / request_s,
   sweep_start): up or down until one rate is kept up with (answers come as fast as requests are sent,
   run_pace) and a higher one is not, then bisected to within BRACKET_RATIO, and the lowest rate missed run
   again. Per rate: the pace of answers, the p50 end-to-end latency, measured and simulated. Above the knee the
   pace of answers is the engine's capacity, so the runs there (at least two, up to SATURATION_WINDOW x the
   rate missed) measure it and its spread.
4. A steady stream of the workload below the knee: how fast the slowdown under load grows below the knee, which
   its median shows (stretch_fit.py), then how much the whole machine slows for a while, and for how long, which
   its tail shows and bursts do not (drift_fit.py), then the first again under the drift (stream_fit.py).
The step jitter is the spread of the measured gaps around the fitted decode step.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from servegate.capacity.bench.load_generator import run_open_loop
from servegate.capacity.bench.run_metrics import RequestRecord, summarize
from servegate.capacity.bench.targets import BenchTarget, PromptFactory
from servegate.capacity.bench.workload import RequestSpec, timed_requests
from servegate.capacity.latency.blackbox_fit import BlackBoxFit, ItlRow, KneeRate, KneeSweep, TtftPoint
from servegate.capacity.latency.drift_fit import measure_stream, stream_rate
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.provenance import FitQuality, Provenance, hardware_id
from servegate.capacity.latency.run_pace import kept_up_with, paces
from servegate.capacity.latency.simulate import SimSetup, simulate
from servegate.capacity.latency.stream_fit import fit_stream
from servegate.capacity.latency.terms import ServingOverheads, StepCost, StepJitter
from servegate.contracts.capacity_section import Workload
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel

SWEEP_STEP = 2.0
"""Factor between the rates the knee search tries until it has one on each side of the knee."""
SWEEP_EXPANSIONS = 5
"""Rates tried out from the prediction at most (2**5 = 32x off it), before the sweep says it found no knee."""
BRACKET_RATIO = 1.2
"""The bisection stops when the rate missed is within this factor of the rate kept up with."""
SWEEP_BISECTIONS = 4
"""Rates the bisection adds at most (a bracket 2x wide is within BRACKET_RATIO after 2)."""
SWEEP_SECONDS = 3.0
"""Seconds of arrivals at each rate of the sweep (at least SWEEP_MIN_REQUESTS requests)."""
SWEEP_MIN_REQUESTS = 20
STEADY_SKIP = 2
"""Gaps of each request left out of the ITL fit: the first ones can hold another request's prefill."""
TTFT_REPEATS = 5
"""Lone requests of each prompt length per burst repeat: a TTFT is one step, so its median needs more samples."""


@dataclass(frozen=True)
class BlackBoxGrid:
    """What the black-box profile sends."""

    prompt_lengths: tuple[int, ...]
    """Prompt lengths of the TTFT sweep (one request at a time)."""
    batches: tuple[int, ...]
    """Burst sizes of the ITL sweep."""
    contexts: tuple[int, ...]
    """Prompt lengths of the ITL sweep's requests."""
    output_tokens: int = 16
    """Tokens each request of the ITL sweep generates (the TTFT sweep: 2)."""
    repeats: int = 3
    """Times each burst is sent (each TTFT length: TTFT_REPEATS times as often, lone requests being short)."""


def engine_variant(served: ServedModel, max_batch_size: int | None = None, tokens: int | None = None) -> ServedModel:
    """The manifest as the engine batches it: continuous, with its (or the given) two limits."""
    b = served.batching
    batching = {
        "mode": "continuous",
        "max_batch_size": max_batch_size or b.max_batch_size,
        "max_wait_ms": 0.0,
        "max_num_batched_tokens": tokens or b.max_num_batched_tokens,
        "chunked_prefill": b.chunked_prefill,
    }
    return served.with_changes(batching=batching)


def engine_setup(served: ServedModel) -> SimSetup:
    """The simulated engine behind an endpoint: continuous batching under the manifest's limits, with an
    unbounded queue and no deadline (a client that talks to the engine directly meets neither)."""
    from servegate.capacity.latency.prediction import sim_setup

    setup = sim_setup(engine_variant(served))
    return SimSetup(**{**setup.__dict__, "max_queue": 1_000_000, "timeout_s": float("inf")})


def blackbox_grid(served: ServedModel, repeats: int = 3) -> BlackBoxGrid:
    """Prompt lengths up to preprocess.max_input_tokens; bursts up to batching.max_batch_size."""
    top = max(4, min(served.preprocess.max_input_tokens, served.batching.max_num_batched_tokens))
    lengths = sorted({max(2, round(top * f)) for f in (0.125, 0.25, 0.5, 0.75, 1.0)})
    batches = sorted({b for b in (1, 2, 4, 8, 16, 32, 64) if b <= served.batching.max_batch_size})
    batches = sorted({*batches, served.batching.max_batch_size})
    out = min(16, served.postprocess.max_output_tokens)
    short = max(2, min(8, top))
    contexts = tuple(sorted({short, max(short, min(top, served.runtime.max_model_len - out) // 2)}))
    return BlackBoxGrid(tuple(lengths), tuple(batches), contexts, out, repeats)


@dataclass(frozen=True)
class ItlPoint:
    """The steady inter-token gaps of one burst of `batch` requests of `context` prompt tokens."""

    batch: int
    context: float
    """Mean tokens each sequence holds while the steady gaps were measured."""
    itl_s: float
    """Typical steady gap (trimmed mean)."""
    gaps: tuple[float, ...]


async def measure_ttft(target: BenchTarget, prompts: PromptFactory, grid: BlackBoxGrid) -> list[TtftPoint]:
    """Lone requests of each prompt length, `repeats` times (interleaved, so a slow moment hits every length)."""
    got: dict[int, list[RequestRecord]] = {n: [] for n in grid.prompt_lengths}
    for _ in range(TTFT_REPEATS * grid.repeats):
        for n in grid.prompt_lengths:
            got[n] += await run_open_loop(target, [RequestSpec(n, 2, 0.0)], prompts)
    points = []
    for n, records in got.items():
        done = [r for r in records if r.ok and r.end is not None]
        if done:
            ttft = typical([r.ttft for r in done])
            finish = statistics.median(r.end - r.token_times[-1] for r in done if r.end is not None)
            points.append(TtftPoint(n, ttft, max(0.0, finish)))
    return points


async def measure_itl(target: BenchTarget, prompts: PromptFactory, grid: BlackBoxGrid) -> list[ItlPoint]:
    """Bursts of each size at each context; the steady gaps of each."""
    points = []
    for ctx in grid.contexts:
        for batch in grid.batches:
            gaps: list[float] = []
            for _ in range(grid.repeats):
                specs = [RequestSpec(ctx, grid.output_tokens, 0.0) for _ in range(batch)]
                for r in await run_open_loop(target, specs, prompts):
                    if r.ok:
                        gaps += r.itls[STEADY_SKIP:]
            if gaps:
                held = ctx + STEADY_SKIP + (grid.output_tokens - STEADY_SKIP) / 2
                points.append(ItlPoint(batch, held, typical(gaps), tuple(gaps)))
    return points


def _nnls(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares with each column scaled to its maximum: coefficients, sum of squared residuals."""
    from scipy.optimize import nnls

    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(x / scale, y)
    coef = np.asarray(coef / scale)
    return coef, float(np.sum((x @ coef - y) ** 2))


CURVATURE_GAIN = 0.5
"""An attention term (cost growing with context) is kept only when it takes the residual below this share of a
fit without it: on a few noisy points a free extra term splits the linear cost, and recovers neither."""


def _fit_with_optional_last(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Fit all columns of x, or all but the last (set to 0) unless the last one clearly pays for itself."""
    full, full_rss = _nnls(x, y)
    reduced, reduced_rss = _nnls(x[:, :-1], y)
    if full_rss < CURVATURE_GAIN * reduced_rss:
        return full
    return np.append(reduced, 0.0)


def typical(values: Sequence[float]) -> float:
    """The 10%-trimmed mean: a latency's sum counts every gap (so a mean, not a median), without the rare
    stall of a shared machine."""
    from scipy.stats import trim_mean

    return float(trim_mean(np.asarray(values, dtype=float), 0.1))


def fit_blackbox(ttft: Sequence[TtftPoint], itl: Sequence[ItlPoint], endpoint: str = "") -> LatencyModel:
    """The latency model's terms from the TTFT and ITL sweeps (see the module notes)."""
    if len({p.batch for p in itl}) < 2 or len(itl) < 3:
        raise ServegateError("the ITL sweep needs bursts of at least two sizes: raise batching.max_batch_size to 2+")
    if len(ttft) < 2:
        raise ServegateError("the TTFT sweep needs two prompt lengths: raise preprocess.max_input_tokens above 4")
    d = np.array([[1.0, p.batch, p.batch * p.context] for p in itl])
    c_step, c_seq, c_attn = _fit_with_optional_last(d, np.array([p.itl_s for p in itl]))
    p = np.array([[1.0, pt.prompt_tokens, float(pt.prompt_tokens) ** 2] for pt in ttft])
    intercept, c_token, c_pattn = _fit_with_optional_last(p, np.array([pt.ttft_s for pt in ttft]))
    steps = StepCost(
        c_step=float(c_step), c_prefill_token=float(c_token), c_prefill_attn=float(c_pattn),
        c_decode_seq=float(c_seq), c_decode_attn=float(c_attn),
    )  # fmt: skip
    overheads = ServingOverheads(
        request_s=max(0.0, float(intercept) - float(c_step)),
        finish_s=statistics.median(pt.finish_s for pt in ttft),
    )
    model = LatencyModel(steps, overheads)
    ratios = [g / model.decode_time(pt.batch, round(pt.context)) for pt in itl for g in pt.gaps]
    # a plain coefficient of variation, not a robust one: seen from outside, a quarter of the gaps are tokens
    # that came in one chunk with the one before (0.01 ms), so the body of the gaps is no step's either
    jitter = StepJitter(spread=float(np.std(ratios) / max(np.mean(ratios), 1e-9)))
    itl_err = [abs(model.decode_time(pt.batch, round(pt.context)) - pt.itl_s) / pt.itl_s for pt in itl]
    ttft_err = [abs(overheads.request_s + model.prefill_time(pt.prompt_tokens) - pt.ttft_s) / pt.ttft_s for pt in ttft]
    box = BlackBoxFit(
        endpoint=endpoint,
        ttft_points=tuple(ttft),
        itl_points=tuple(ItlRow(pt.batch, pt.context, pt.itl_s, len(pt.gaps)) for pt in itl),
        ttft_median_rel_error=float(np.median(ttft_err)),
        itl_median_rel_error=float(np.median(itl_err)),
    )
    return replace(model, jitter=jitter, fit=FitQuality(black_box=box))


async def knee_sweep(
    target: BenchTarget,
    prompts: PromptFactory,
    setup: SimSetup,
    model: LatencyModel,
    workload: Workload,
    seconds: float = SWEEP_SECONDS,
) -> KneeSweep:
    """Search the rate the engine stops keeping up with (see the module notes): from the predicted capacity (at
    most sweep_start's bound), up or down by SWEEP_STEP until one rate is kept up with and a higher one is not,
    then bisect (geometrically) until they are within BRACKET_RATIO; the lowest rate missed is run again, a repeat
    of the capacity's measurement."""
    from servegate.capacity.latency.prediction import saturation_throughput

    capacity = saturation_throughput(setup, model, workload)
    rows: list[KneeRate] = []

    async def run(rate: float) -> KneeRate:
        specs = timed_requests(workload, rate, seconds, seed=31 + len(rows), minimum=SWEEP_MIN_REQUESTS)
        n = len(specs)
        records = await run_open_loop(target, specs, prompts)
        measured = summarize(records)
        simulated = simulate(setup, model, specs, seed=0).summary()
        done, sent = paces(records)
        row = KneeRate(
            rate_rps=rate,
            requests=n,
            measured_requests_per_s=float(measured["throughput"]["requests_per_s"]),
            measured_e2el_p50_ms=float(measured["e2el_ms"]["p50"]),
            simulated_e2el_p50_ms=float(simulated["e2el_ms"]["p50"]),
            measured_ttft_p50_ms=float(measured["ttft_ms"]["p50"]),
            simulated_ttft_p50_ms=float(simulated["ttft_ms"]["p50"]),
            kept_up=kept_up_with(records),
            completion_rps=done,
            sent_rps=sent,
        )
        rows.append(row)
        return row

    row = await run(sweep_start(model, capacity))
    up = row.kept_up
    for _ in range(SWEEP_EXPANSIONS):  # out from the prediction until the other side of the knee is met
        if row.kept_up != up:
            break
        row = await run(row.rate_rps * (SWEEP_STEP if up else 1 / SWEEP_STEP))
    kept, missed = _bracket(rows)
    for _ in range(SWEEP_BISECTIONS):
        if kept is None or missed is None or missed / kept <= BRACKET_RATIO:
            break
        await run((kept * missed) ** 0.5)
        kept, missed = _bracket(rows)
    if missed is not None:
        await run(missed)  # the repeat: a second measurement of the engine's pace once it falls behind
        kept, missed = _bracket(rows)
    return KneeSweep(capacity, kept, tuple(rows), missed)


def sweep_start(model: LatencyModel, predicted_rps: float) -> float:
    """The knee search's first rate: the capacity the step fit predicts, but at most 1 / the lone request's serving
    overhead (`request_s`: HTTP, tokenization, the hand-off), which an engine's API server does mostly on one
    thread, so a stream cannot outrun it. The step fit leaves that serving work out: on vLLM's CPU build it
    predicted 428-1,010 requests/s for a capacity near 40, and the search's first runs sent up to 3,000 requests
    in 3 s. Those floods measured paces (98.9, 280.7 requests/s) no load near the knee gives, and the runs after
    them a capacity of 34.5 requests/s where three searches started near the knee measured 36.4-41.9."""
    bound = 1.0 / model.overheads.request_s if model.overheads.request_s > 0 else predicted_rps
    return min(predicted_rps, bound)


KNEE_FIT_BISECTIONS = 14
"""Halvings of fit_to_knee's bracket on serving_work_s, [0, 1 / capacity]: to within 1 / 16,000 of it (each one
simulation of the capacity, a fraction of a second)."""


def fit_to_knee(
    model: LatencyModel, knee: KneeSweep, setup: SimSetup, workload: Workload
) -> tuple[LatencyModel, KneeSweep]:
    """The model with the machine's time per request that lone requests and bursts do not show (`serving_work_s`)
    and the capacity it was read at, C, the engine's measured pace past the knee. Under a steady stream the client,
    the HTTP server, tokenization, streaming and the engine share the cores, so at r requests/s served every part
    of a request takes 1 / (1 - r x serving_work_s) as long (processor sharing, ServingOverheads.stretch), which is
    also what makes a request slower at half the capacity than alone. The work is bisected in [0, 1 / C] until
    the simulated capacity is C (it falls as the work grows); 0 when the steps alone keep no more than C (the engine
    is the bottleneck, and the simulated queue already holds it)."""
    from servegate.capacity.latency.prediction import saturation_throughput

    saturated = knee.saturated_rps()
    if len(saturated) < 2:
        return model, knee
    measured = statistics.median(saturated)

    def with_work(work: float) -> LatencyModel:
        shared = replace(model.overheads, serving_work_s=work, capacity_rps=measured if work else 0.0)
        return replace(model, overheads=shared)

    low, high = 0.0, 1.0 / measured
    if saturation_throughput(setup, with_work(0.0), workload) <= measured:
        high = 0.0
    for _ in range(KNEE_FIT_BISECTIONS if high else 0):
        mid = (low + high) / 2
        if saturation_throughput(setup, with_work(mid), workload) > measured:
            low = mid
        else:
            high = mid
    fitted = with_work((low + high) / 2)
    return fitted, replace(knee, measured_capacity_rps=measured, serving_work_s=fitted.overheads.serving_work_s)


def _bracket(rows: Sequence[KneeRate]) -> tuple[float | None, float | None]:
    """The highest rate kept up with below the lowest rate missed (a slow moment can miss a rate a faster one
    kept: the bracket is the tightest consistent pair), each None when there is none."""
    missed = min((r.rate_rps for r in rows if not r.kept_up), default=None)
    kept = [r.rate_rps for r in rows if r.kept_up and (missed is None or r.rate_rps < missed)]
    return (max(kept) if kept else None), missed


async def profile_target(
    target: BenchTarget,
    served: ServedModel,
    prompts: PromptFactory,
    *,
    repeats: int = 3,
    sweep_seconds: float = SWEEP_SECONDS,
    stage: Callable[[str], None] | None = None,
) -> LatencyModel:
    """The three sweeps against one engine (see the module notes) and the model fitted on them."""
    from servegate.capacity.latency.prediction import profile_key

    grid = blackbox_grid(served, repeats)
    began = time.time()
    if stage:
        stage("TTFT against prompt length, one request at a time")
    ttft = await measure_ttft(target, prompts, grid)
    if stage:
        stage("ITL against concurrency and context")
    itl = await measure_itl(target, prompts, grid)
    endpoint = served.runtime.endpoint_url or served.runtime.backend
    model = fit_blackbox(ttft, itl, endpoint)
    box = model.fit.black_box
    assert box is not None
    workload = served.capacity.workload
    if workload is not None:
        if stage:
            stage("the knee, by a rate search")
        setup = engine_setup(served)
        knee = await knee_sweep(target, prompts, setup, model, workload, sweep_seconds)
        model, knee = fit_to_knee(model, knee, setup, workload)
        box = replace(box, knee=knee)
        if knee.measured_capacity_rps:
            rate = stream_rate(workload, knee.measured_capacity_rps)
            if stage:
                stage(f"a steady stream at {rate:.3g} requests/s, for the load's shape and the machine's drift")
            specs, records = await measure_stream(target, prompts, workload, rate)
            model, stream = fit_stream(
                setup, model, specs, records, rate, refit=lambda m: fit_to_knee(m, knee, setup, workload)[0]
            )
            knee = replace(knee, serving_work_s=model.overheads.serving_work_s)
            box = replace(box, knee=knee, stream=stream)
    provenance = Provenance(
        key=profile_key(served),
        fingerprint=served.fingerprint,
        hardware={**hardware_id(), "endpoint": endpoint},
        profiled_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        load_average_1m=os.getloadavg()[0],
    )
    box = replace(box, profile_seconds=time.time() - began)
    return replace(model, provenance=provenance, fit=FitQuality(black_box=box))


def profile_endpoint(
    served: ServedModel,
    repeats: int = 3,
    sweep_seconds: float = SWEEP_SECONDS,
    stage: Callable[[str], None] | None = None,
) -> LatencyModel:
    """Profile the manifest's engine from outside: its endpoint, or the server servegate starts for it."""
    from servegate.capacity.bench.own_server import against_server, manifest_tokenizer, own_server

    prompts = PromptFactory(manifest_tokenizer(served))
    with own_server(served) as server:

        def action(target: Any) -> Any:
            return profile_target(target, served, prompts, repeats=repeats, sweep_seconds=sweep_seconds, stage=stage)

        try:
            model: LatencyModel = against_server(server.url, served, action)
        except ConnectionError as exc:
            raise ServegateError(f"cannot profile {server.url}: {exc}") from None
        return with_process_memory(model, served, getattr(server, "pid", None))


def with_process_memory(model: LatencyModel, served: ServedModel, pid: int | None) -> LatencyModel:
    """The model with the resident memory of the server's process tree (`pid`: the server servegate started;
    None for an endpoint, whose processes it cannot see), read now, after the sweeps."""
    from servegate.capacity.bench.process_memory import measure_process_group

    box = model.fit.black_box
    if pid is None or box is None:
        return model
    kv = served.runtime.kv_cache
    # without a kv_cache section servegate starts vLLM with VLLM_CPU_KVCACHE_SPACE=1 (runtime/remote/vllm_backend.py)
    pool = kv.memory_budget if kv is not None else (2**30 if served.runtime.starts_vllm else 0)
    group = measure_process_group(pid, pool)
    return replace(model, fit=replace(model.fit, black_box=replace(box, process_memory=group)))
