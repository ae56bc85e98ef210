"""The machine's drift, fitted on a steady stream: a slowdown of the whole machine that lasts in time.

On two shared cores vLLM's CPU build (its API server, its engine core, its OpenMP worker and the bench client
beside them) slows for a second or two at a time under a steady stream: the median end-to-end latency of one
second's requests moved 29-156 ms within one run at 24 requests/s, for the same arrivals (benchmarks/README.md,
issue 40). The step jitter the bursts measure has no such memory (its correlation from step to step is nil), so it
averages out within a request, and the model predicted that run's p50 40% and p99 2-5x low.

After the knee search a black-box profile sends the declared workload for STREAM_SECONDS at its own rate (at most
STREAM_LOAD of the measured capacity), and fits the drift (StepJitter.drift_spread, drift_seconds) on it:

1. the correlation time: each answered request's log of measured over simulated end-to-end latency (the same
   requests simulated without drift, the mean over DRIFT_SEEDS jitter seeds), correlated between requests sent
   a given gap apart (LAG_BINS); `a x exp(-gap / t)` fitted to those correlations over CORRELATION_TIMES, a <= 1
   (nothing lasts when a < MIN_CORRELATION or t is under the shortest gap);
2. the spread: of SPREAD_GRID, the one under which the stream simulated with the drift (over the same seeds) has
   the measured TAIL percentile of end-to-end latency, nearest in ratio. The serving work is fitted to the knee
   again under each spread tried (`refit`, blackbox.fit_to_knee): the drift's median is 1, the speed bursts
   measure, and its mean, which the knee's capacity holds, is above it. 0 when nothing lasts (no positive
   correlation) or the simulation without drift is already as slow.

The drift adds the queue a slow moment builds near the knee, which is the tail of a stream's latency. It does not
raise the middle: under a larger spread less of the capacity is left to the serving work, so a stream's median
falls a little as its tail grows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from servegate.capacity.bench.load_generator import run_open_loop
from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.bench.targets import BenchTarget, PromptFactory
from servegate.capacity.bench.workload import RequestSpec, timed_requests
from servegate.capacity.latency.blackbox_fit import SteadyStream
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.simulate import SimSetup, simulate
from servegate.contracts.capacity_section import Workload

STREAM_SECONDS = 12.0
"""Seconds of arrivals in the steady stream: several slow moments of a second or two each."""
STREAM_LOAD = 0.7
"""Most of the measured capacity the stream is sent at (the declared rate when lower): near enough to the knee
that a slow moment builds a queue, far enough that the stream keeps up."""
STREAM_MIN_REQUESTS = 20
"""Fewest requests the stream sends, however low its rate (as many as a run of the knee search)."""
STREAM_SEED = 97
"""Seed of the stream's requests (apart from the knee search's)."""
DRIFT_SEEDS = 4
"""Jitter seeds each simulation of the stream is averaged over (the same ones at every spread tried)."""
TAIL = 95
"""The percentile of the stream's end-to-end latency the drift is fitted to: its slow moments are the tail, and a
12-second stream holds enough requests for a p95 (a p99 needs 368 for its interval, percentiles.interval_floor)."""
SPREAD_GRID = tuple(round(0.1 * k, 1) for k in range(16))
"""The drift spreads tried (log standard deviations, 0-1.5: at 1.5 a slow moment one standard deviation out runs
4.5x slower). A grid, not a bisection: the stream's simulated p95 need not grow steadily with the spread, since the
serving work refitted under each one shrinks as the drift's mean grows."""
LAG_BINS = ((0.1, 0.25), (0.25, 0.5), (0.5, 1.0), (1.0, 2.0), (2.0, 4.0))
"""Gaps between sends (seconds) whose pairs of requests give one correlation each. Gaps under 0.1 s are left
out: requests sent that close share their steps, so they correlate whatever the machine does."""
MIN_PAIRS = 20
"""Pairs of requests a gap's correlation needs to be used."""
MIN_CORRELATION = 0.1
"""Least correlation, at no gap, of the fitted exponential for a drift to be fitted at all: below it the
requests' own noise is all there is (a 12-second stream's correlations scatter by about 0.05 around 0)."""
CORRELATION_TIMES = tuple(float(t) for t in np.geomspace(0.05, 10.0, 60))
"""The correlation times tried (seconds)."""


def stream_rate(workload: Workload, capacity_rps: float) -> float:
    """The stream's rate: the declared one, at most STREAM_LOAD of the measured capacity."""
    ceiling = STREAM_LOAD * capacity_rps
    declared = workload.rate_rps if workload.arrival != "closed" else None
    return min(declared, ceiling) if declared else ceiling


async def measure_stream(
    target: BenchTarget, prompts: PromptFactory, workload: Workload, rate_rps: float
) -> tuple[list[RequestSpec], list[RequestRecord]]:
    """Send the stream; its specs and their records, in the same order."""
    specs = timed_requests(workload, rate_rps, STREAM_SECONDS, STREAM_SEED, minimum=STREAM_MIN_REQUESTS)
    return specs, await run_open_loop(target, specs, prompts)


def simulated_e2e(setup: SimSetup, model: LatencyModel, specs: Sequence[RequestSpec], drift: bool) -> np.ndarray:
    """Per spec, end-to-end seconds simulated under each of DRIFT_SEEDS seeds (rows: seeds; nan: not answered)."""
    rows = []
    for seed in range(DRIFT_SEEDS):
        records = simulate(setup, model, specs, seed=seed, drift=drift).records
        rows.append([r.e2el if r.ok else np.nan for r in records])
    return np.array(rows, dtype=float)


def measured_e2e(records: Sequence[RequestRecord]) -> np.ndarray:
    """Each record's end-to-end seconds (nan: not answered)."""
    return np.array([r.e2el if r.ok else np.nan for r in records], dtype=float)


def lag_correlations(sent: Sequence[float], residuals: Sequence[float]) -> list[tuple[float, float, float]]:
    """(shortest gap, longest gap, correlation) of the residuals of requests sent within each of LAG_BINS of each
    other (the residuals centred on their mean, over their variance); bins with fewer than MIN_PAIRS pairs are
    left out."""
    t = np.asarray(sent, dtype=float)
    r = np.asarray(residuals, dtype=float)
    r = r - r.mean()
    variance = float(r.var())
    if len(r) < 3 or variance <= 0:
        return []
    gap = np.abs(t[:, None] - t[None, :])
    product = r[:, None] * r[None, :]
    upper = np.triu(np.ones_like(gap, dtype=bool), k=1)
    out = []
    for lo, hi in LAG_BINS:
        pairs = upper & (gap > lo) & (gap <= hi)
        if int(pairs.sum()) >= MIN_PAIRS:
            out.append((lo, hi, float(product[pairs].mean() / variance)))
    return out


def correlation_time(correlations: Sequence[tuple[float, float, float]]) -> float:
    """The t of `a x exp(-gap / t)` (0 <= a <= 1) closest, in least squares, to the correlations at each bin's
    geometric middle gap; 0 when nothing lasts: a fitted a under MIN_CORRELATION, or a t shorter than the
    shortest gap measured (what one bin's noise fits)."""
    gaps = np.array([(lo * hi) ** 0.5 for lo, hi, _ in correlations])
    corr = np.array([c for _, _, c in correlations])
    best, best_a, best_error = 0.0, 0.0, float("inf")
    for t in CORRELATION_TIMES:
        shape = np.exp(-gaps / t)
        a = float(np.clip(shape @ corr / (shape @ shape), 0.0, 1.0)) if len(gaps) else 0.0
        error = float(np.sum((a * shape - corr) ** 2))
        if error < best_error:
            best, best_a, best_error = t, a, error
    if best_a < MIN_CORRELATION or best < LAG_BINS[0][0]:
        return 0.0
    return best


def seeds_percentile(e2e: np.ndarray, q: float = TAIL) -> float:
    """The q-th percentile of each seed's simulated latencies (rows), averaged over the seeds."""
    return float(np.mean([np.percentile(row[np.isfinite(row)], q) for row in e2e]))


def _with_drift(model: LatencyModel, spread: float, seconds: float) -> LatencyModel:
    return replace(model, jitter=replace(model.jitter, drift_spread=spread, drift_seconds=seconds))


def fit_drift(
    setup: SimSetup,
    model: LatencyModel,
    specs: Sequence[RequestSpec],
    records: Sequence[RequestRecord],
    rate_rps: float,
    refit: Callable[[LatencyModel], LatencyModel] = lambda m: m,
) -> tuple[LatencyModel, SteadyStream | None]:
    """The model with the drift fitted on a measured stream (see the module notes), and the stream's record (the
    model unchanged and None when fewer than three of its requests were answered). `refit` fits what the knee
    measured again under each spread tried (blackbox.fit_to_knee: the drift's mean slows every step, so less of
    the capacity is left to the serving work)."""
    measured = measured_e2e(records)
    sent = np.array([r.scheduled for r in records])
    rows = simulated_e2e(setup, model, specs, drift=False)
    plain = np.nanmean(rows, axis=0)
    ok = np.isfinite(measured) & np.isfinite(plain) & (measured > 0) & (plain > 0)
    if int(ok.sum()) < 3:  # an engine that failed the stream: the knee search has already said so
        return model, None
    correlations = lag_correlations(sent[ok], np.log(measured[ok] / plain[ok]))
    seconds = correlation_time(correlations)
    target = float(np.percentile(measured[ok], TAIL))
    without = seeds_percentile(rows[:, ok])
    best, best_tail = model, without
    if seconds > 0 and target > without:
        for spread in SPREAD_GRID[1:]:
            candidate = refit(_with_drift(model, spread, seconds))
            tail = seeds_percentile(simulated_e2e(setup, candidate, specs, drift=True)[:, ok])
            if abs(math.log(tail / target)) < abs(math.log(best_tail / target)):
                best, best_tail = candidate, tail
    spread = best.jitter.drift_spread
    stream = SteadyStream(
        rate_rps=rate_rps,
        requests=len(records),
        measured_mean_ms=1000 * float(np.mean(measured[ok])),
        measured_p50_ms=1000 * float(np.median(measured[ok])),
        measured_p99_ms=1000 * float(np.percentile(measured[ok], 99)),
        measured_tail_ms=1000 * target,
        simulated_tail_ms=1000 * without,
        fitted_tail_ms=1000 * best_tail,
        correlation=tuple(correlations),
        drift_spread=spread,
        drift_seconds=best.jitter.drift_seconds,
    )
    return best, stream
