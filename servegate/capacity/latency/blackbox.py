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
3. The knee, by a short open-loop rate sweep around the capacity the fitted model predicts: per rate, the
   throughput achieved and the p50 end-to-end latency, measured and simulated; the measured knee is the
   highest rate the engine kept up with.
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
from servegate.capacity.bench.workload import RequestSpec, make_requests, with_rate
from servegate.capacity.latency.blackbox_fit import BlackBoxFit, ItlRow, KneeRate, KneeSweep, TtftPoint
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.provenance import FitQuality, Provenance, hardware_id
from servegate.capacity.latency.simulate import SimSetup, simulate
from servegate.capacity.latency.terms import ServingOverheads, StepCost, StepJitter
from servegate.contracts.capacity_section import Workload
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel

SWEEP_LOADS = (0.5, 0.8, 1.0, 1.2)
"""Open-loop rates of the knee sweep, as fractions of the capacity the fitted model predicts."""
SWEEP_SECONDS = 2.0
"""Seconds of arrivals at each rate of the sweep (at least SWEEP_MIN_REQUESTS requests)."""
SWEEP_MIN_REQUESTS = 20
STEADY_SKIP = 2
"""Gaps of each request left out of the ITL fit: the first ones can hold another request's prefill."""
TTFT_REPEATS = 5
"""Lone requests of each prompt length per burst repeat: a TTFT is one step, so its median needs more samples."""
KEPT_UP = 0.9
"""A rate whose achieved throughput is at least this share of the offered one was kept up with."""


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
    """Open-loop runs of the workload around the predicted capacity: measured against simulated, and the knee."""
    from servegate.capacity.latency.prediction import saturation_throughput

    capacity = saturation_throughput(setup, model, workload)
    rows = []
    for i, factor in enumerate(SWEEP_LOADS):
        rate = factor * capacity
        n = max(SWEEP_MIN_REQUESTS, round(rate * seconds))
        specs = make_requests(with_rate(workload, rate).model_copy(update={"num_requests": n}), seed=31 + i)
        measured = summarize(await run_open_loop(target, specs, prompts))
        simulated = simulate(setup, model, specs, seed=0).summary()
        achieved = float(measured["throughput"]["requests_per_s"])
        rows.append(
            KneeRate(
                rate_rps=rate,
                requests=n,
                measured_requests_per_s=achieved,
                measured_e2el_p50_ms=float(measured["e2el_ms"]["p50"]),
                simulated_e2el_p50_ms=float(simulated["e2el_ms"]["p50"]),
                measured_ttft_p50_ms=float(measured["ttft_ms"]["p50"]),
                simulated_ttft_p50_ms=float(simulated["ttft_ms"]["p50"]),
                kept_up=achieved >= KEPT_UP * rate,
            )
        )
    kept = [r.rate_rps for r in rows if r.kept_up]
    return KneeSweep(capacity, max(kept) if kept else None, tuple(rows))


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
            stage("the knee, by a short rate sweep")
        knee = await knee_sweep(target, prompts, engine_setup(served), model, workload, sweep_seconds)
        box = replace(box, knee=knee)
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
            return against_server(server.url, served, action)
        except ConnectionError as exc:
            raise ServegateError(f"cannot profile {server.url}: {exc}") from None
