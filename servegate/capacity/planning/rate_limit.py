"""The most requests/s one replica carries under the latency targets, with its interval, and what binds there.

The workload's shape is kept and its rate varied (open loop, its own arrival process). At each rate the
simulator runs the same requests under several jitter seeds (the profile's step jitter), and the largest
target ratio (predicted / target, over every declared latency percentile) of each seed says whether the
targets hold there. Bisection finds the largest rate where they hold for the median seed (the rate), and
where they hold for the slowest and for the fastest seed (the interval's low and high ends). Without a
latency target the replica's capacity (requests always waiting) is the limit: throughput binds. When the KV
pool runs full at the limit (preemptions, or blocks nearly all used), memory binds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
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
    level: float = 0.8
    """Share of jitter seeds between the interval's ends (all but the slowest and the fastest of RATE_SEEDS)."""

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
    if not declared:
        kv = _kv_full(setup, runs(capacity))
        binding, why = ("memory", "the KV pool runs full at capacity") if kv else ("throughput", "no latency target")
        detail = f"{why}: the replica's capacity with requests always waiting, {capacity:.3g} requests/s"
        return RateLimit(capacity, capacity, capacity, capacity, binding, None, detail)

    def holds(pick: Callable[[list[float]], float]) -> Callable[[float], bool]:
        return lambda rate: pick(worst(rate)) <= 1.0

    top = 1.2 * capacity  # latency can hold a little past the closed-loop capacity on a short run
    rate = _bisect(holds(statistics.median), 0.0, top, bisections)
    low = _bisect(holds(max), 0.0, rate, 5) if interval and seeds > 1 else rate
    high = _bisect(holds(min), rate, top, 5) if interval and seeds > 1 else rate
    return _limit(setup, targets, capacity, rate, low, high, runs, top / 2**bisections, seeds)


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
    seeds: int,
) -> RateLimit:
    """The RateLimit at `rate`: what binds just above it."""
    above = runs(max(rate + step, step))
    ratios = latency_ratios(targets, above[len(above) // 2])
    name = max(ratios, key=lambda k: ratios[k])
    level = (seeds - 2) / seeds if seeds > 2 else 0.0
    if rate <= 0.0:
        detail = f"{name} is missed even at {step:.3g} requests/s: no rate meets it on this replica"
        return RateLimit(0.0, 0.0, high, capacity, "latency", name, detail, level)
    if _kv_full(setup, runs(rate)):
        detail = f"the KV pool runs full at {rate:.3g} requests/s (preemptions), and then {name} is missed"
        return RateLimit(rate, low, high, capacity, "memory", name, detail, level)
    if rate >= capacity:
        detail = f"the latency targets hold up to the replica's capacity, {capacity:.3g} requests/s"
        return RateLimit(rate, low, high, capacity, "throughput", None, detail, level)
    detail = f"above {rate:.3g} requests/s {name} is missed (capacity {capacity:.3g} requests/s)"
    return RateLimit(rate, low, high, capacity, "latency", name, detail, level)
