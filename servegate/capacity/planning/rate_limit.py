"""The most requests/s one replica carries under the latency targets, with its interval, and what binds there.

The workload's shape is kept and its rate varied (open loop, its own arrival process). At each rate the
simulator runs the same requests under several jitter seeds (the profile's step jitter), and the largest
target ratio (predicted / target, over every declared latency percentile) of each seed says whether the
targets hold there. Bisection finds the largest rate where they hold for the median seed (the rate), and
where they hold for the slowest and for the fastest seed. Without a latency target, or when the targets hold
up to it, the replica's capacity (requests always waiting) is the limit: throughput binds (a rate above it
only looks carried on a short run, its queue growing without end). When the KV pool runs full at the limit
(preemptions, or blocks nearly all used), memory binds.

The interval (INTERVAL_LEVEL) adds, as independent normal errors, the seeds' spread and what the profile
measured (measured_spread): for an engine profiled from outside, the spread of its pace over the knee
search's runs past the knee (the capacity measured itself, and the model fitted to it), else the fit's
error on the decode steps (capacity is made of them). Where throughput binds at a capacity so measured, the
seeds' spread of the simulated capacity is left out: the measured paces already hold the machine's noise, and
the simulator's replay of the step jitter on top of them took the interval down to 0.4 requests/s on vLLM's
CPU build (a claim of 30.7). It is at least
as wide as the bisection's last step above the rate, which it did not resolve: never of zero width.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

from servegate.capacity.bench.workload import make_requests, with_rate
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.prediction import saturation_throughput
from servegate.capacity.latency.simulate import SimSetup, simulate
from servegate.contracts.capacity_section import Targets, Workload

RATE_SEEDS = 5
"""Jitter seeds simulated at each rate tried."""
BISECTIONS = 7
"""Halvings of the rate bracket for the central rate (1/128 of the capacity); 5 more for each interval end."""
INTERVAL_LEVEL = 0.90
"""Share of runs the per-replica interval is meant to hold (checked in benchmarks/planner_accuracy.py)."""
KV_FULL = 0.95
"""Share of the KV pool in use at which memory is said to bind."""
_KEYS = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "e2e_ms": "e2el_ms"}


@dataclass(frozen=True)
class RateLimit:
    """The most requests/s one replica carries under the targets, its interval, and the constraint that binds."""

    rate_rps: float
    """With the median jitter seed."""
    low_rps: float
    """With the slowest seed: the interval's cautious end."""
    high_rps: float
    """With the fastest seed."""
    capacity_rps: float
    """Requests/s the replica sustains with requests always waiting."""
    binding: str
    """`latency`, `throughput` or `memory`."""
    binding_target: str | None
    """The latency target that binds (e.g. `e2e_ms.p99`), when latency binds."""
    detail: str
    """One sentence on why."""
    level: float = INTERVAL_LEVEL
    """Share of runs the interval is meant to hold (module notes)."""
    measured_spread: float = 0.0
    """Relative standard deviation of the capacity as the profile measured it (measured_spread)."""
    spread_from: str = ""
    """What that spread was measured on."""

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return dict(self.__dict__)


def latency_ratios(targets: Targets | None, summary: dict[str, Any]) -> dict[str, float]:
    """Predicted / target for every declared latency percentile (above 1: missed)."""
    out: dict[str, float] = {}
    for field, key in _KEYS.items():
        pct = getattr(targets, field) if targets is not None else None
        for p in ("p50", "p95", "p99"):
            bound = getattr(pct, p) if pct is not None else None
            if bound is not None:
                value = float(summary[key][p])
                out[f"{field}.{p}"] = value / bound if value == value else float("inf")  # nan: nothing completed
    return out


def max_rate(
    setup: SimSetup,
    model: LatencyModel,
    workload: Workload,
    targets: Targets | None,
    *,
    num_requests: int = 200,
    seeds: int = RATE_SEEDS,
    interval: bool = True,
    seed: int = 0,
    bisections: int = BISECTIONS,
) -> RateLimit:
    """Bisect the rate (see the module notes), to 1.2 x capacity / 2**bisections."""
    capacity = saturation_throughput(setup, model, workload, seed=seed)
    cache: dict[float, list[dict[str, Any]]] = {}

    def runs(rate: float) -> list[dict[str, Any]]:
        if rate not in cache:
            specs = make_requests(with_rate(workload, rate), seed, num_requests=num_requests)
            cache[rate] = [simulate(setup, model, specs, seed=seed + s).summary() for s in range(seeds)]
        return cache[rate]

    def worst(rate: float) -> list[float]:
        return sorted(max(latency_ratios(targets, r).values(), default=0.0) for r in runs(rate))

    declared = targets is not None and any(getattr(targets, field) is not None for field in _KEYS)
    step = 1.2 * capacity / 2**bisections
    if not declared:
        kv = _kv_full(setup, runs(capacity))
        binding, why = ("memory", "the KV pool runs full at capacity") if kv else ("throughput", "no latency target")
        detail = f"{why}: the replica's capacity with requests always waiting, {capacity:.3g} requests/s"
        low, high = _capacity_range(setup, model, workload, seeds, seed) if interval else (capacity, capacity)
        limit = RateLimit(capacity, low, high, capacity, binding, None, detail)
        return with_interval(limit, model, seeds, step) if interval else limit

    def holds(pick: Callable[[list[float]], float]) -> Callable[[float], bool]:
        return lambda rate: pick(worst(rate)) <= 1.0

    top = 1.2 * capacity  # latency can hold a little past the closed-loop capacity on a short run
    rate = _bisect(holds(statistics.median), 0.0, top, bisections)
    low = _bisect(holds(max), 0.0, rate, 5) if interval and seeds > 1 else rate
    high = _bisect(holds(min), rate, top, 5) if interval and seeds > 1 else rate
    if rate >= capacity:  # held up to capacity: beyond it only a short run's queue has not grown yet
        rate, low, high = capacity, capacity, capacity
        if interval and seeds > 1 and not _knee_paces(model):  # a measured capacity carries its own spread
            low, high = _capacity_range(setup, model, workload, seeds, seed)
    limit = _limit(setup, targets, capacity, rate, low, high, runs, step)
    return with_interval(limit, model, seeds, step) if interval else limit


def _capacity_range(
    setup: SimSetup, model: LatencyModel, workload: Workload, seeds: int, seed: int
) -> tuple[float, float]:
    """The lowest and highest capacity over the jitter seeds."""
    values = [saturation_throughput(setup, model, workload, seed=seed + s) for s in range(seeds)]
    return min(values), max(values)


def _knee_paces(model: LatencyModel) -> list[float]:
    """The paces of the knee search's runs past the knee that the capacity was read off (blackbox_fit.KneeSweep
    .saturated_rps); empty where it was not measured so (fewer than two, or no black-box knee)."""
    box = model.fit.black_box
    paces = box.knee.saturated_rps() if box is not None and box.knee is not None else []
    return paces if len(paces) >= 2 else []


def measured_spread(model: LatencyModel) -> tuple[float, str]:
    """The relative standard deviation of a replica's capacity as the profile measured it, and on what: the
    fit's median error on the steps, and the knee search's runs past the knee (their pace is the capacity)."""
    fit, parts = model.fit, []
    if (box := fit.black_box) is not None:
        paces = _knee_paces(model)
        if paces and box.knee is not None:  # capacity measured itself (and fitted to): its own spread
            parts.append((box.knee.capacity_spread(), f"{len(paces)} runs past the knee"))
        else:
            parts.append((box.itl_median_rel_error, f"the decode-step fit over {len(box.itl_points)} bursts"))
    elif (err := fit.serving_steps or fit.model_steps) is not None:
        parts.append((err.median_rel_error, f"the step fit over {err.steps} steps"))
    return math.sqrt(sum(x * x for x, _ in parts)), ", ".join(name for _, name in parts)


def with_interval(limit: RateLimit, model: LatencyModel, seeds: int, step: float) -> RateLimit:
    """The limit's interval at INTERVAL_LEVEL (module notes): the seeds' range (min to max, read as the central
    (seeds - 1) / (seeds + 1) share) and the profile's measured spread, as independent normal errors; its
    upper end at least one bisection step above the rate."""
    if limit.rate_rps <= 0.0:
        return replace(limit, level=INTERVAL_LEVEL)
    z = NormalDist().inv_cdf(0.5 + INTERVAL_LEVEL / 2)
    z_seeds = NormalDist().inv_cdf(0.5 + (seeds - 1) / (seeds + 1) / 2) if seeds > 1 else 1.0
    spread, source = measured_spread(model)
    sigma = spread * limit.rate_rps

    def half(seed_side: float) -> float:
        return z * math.hypot(seed_side / z_seeds, sigma)

    low = max(0.0, limit.rate_rps - half(limit.rate_rps - limit.low_rps))
    high = max(limit.rate_rps + half(limit.high_rps - limit.rate_rps), limit.rate_rps + step)
    return replace(limit, low_rps=low, high_rps=high, level=INTERVAL_LEVEL, measured_spread=spread, spread_from=source)


def _bisect(ok: Callable[[float], bool], lo: float, hi: float, steps: int) -> float:
    """The largest rate in [lo, hi] where `ok` holds, to (hi - lo) / 2**steps; lo when it holds nowhere above
    (tried first at the bracket's finest step, so an unreachable target costs one try)."""
    if hi <= lo or not ok(lo + (hi - lo) / 2**steps):
        return lo
    if ok(hi):
        return hi
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _kv_full(setup: SimSetup, runs: list[dict[str, Any]]) -> bool:
    """Whether the KV pool ran full (preemptions, or nearly every block in use) in the median run."""
    s = runs[len(runs) // 2]
    return bool(s["preemptions"] > 0 or s["kv_blocks_used"]["max"] >= KV_FULL * setup.num_blocks)


def _limit(
    setup: SimSetup,
    targets: Targets | None,
    capacity: float,
    rate: float,
    low: float,
    high: float,
    runs: Callable[[float], list[dict[str, Any]]],
    step: float,
) -> RateLimit:
    """The RateLimit at `rate`: what binds just above it."""
    above = runs(max(rate + step, step))
    ratios = latency_ratios(targets, above[len(above) // 2])
    name = max(ratios, key=lambda k: ratios[k])
    if rate <= 0.0:
        detail = f"{name} is missed even at {step:.3g} requests/s: no rate meets it on this replica"
        return RateLimit(0.0, 0.0, high, capacity, "latency", name, detail)
    if _kv_full(setup, runs(rate)):
        detail = f"the KV pool runs full at {rate:.3g} requests/s (preemptions), and then {name} is missed"
        return RateLimit(rate, low, high, capacity, "memory", name, detail)
    if rate >= capacity:
        detail = f"the latency targets hold up to the replica's capacity, {capacity:.3g} requests/s"
        return RateLimit(rate, low, high, capacity, "throughput", None, detail)
    detail = f"above {rate:.3g} requests/s {name} is missed (capacity {capacity:.3g} requests/s)"
    return RateLimit(rate, low, high, capacity, "latency", name, detail)
