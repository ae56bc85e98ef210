"""`gate plan --verify`: where the plan is benched, and predicted against measured at each point.

A plan's figure that buys hardware is the rate one replica carries, so the bench does not stop at the
workload's own rate: it runs the recommended policy at the operating point (the workload as declared), at
the claimed per-replica rate, and just past it (PAST_CLAIM times it), each after a few lone requests that
re-check how fast the machine runs now (speed_check.py), so a slowdown between points is seen where it
happened. Every point has its prediction interval (interval.py: the same requests simulated under the
profile's jitter seeds) beside what was measured, and whether the engine kept up with the rate sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servegate.capacity.bench.workload import make_requests, with_rate
from servegate.capacity.latency.interval import prediction_interval
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.prediction import predict, sim_setup
from servegate.contracts.capacity_section import Workload
from servegate.contracts.manifest import ServedModel

PAST_CLAIM = 1.2
"""The third point: this many times the claimed per-replica rate, where the plan says targets are missed."""
VERIFY_SEEDS = 10
"""Jitter seeds for each point's interval."""
COMPARED = (("ttft_ms", "p50"), ("tpot_ms", "p50"), ("e2el_ms", "p50"), ("e2el_ms", "p99"))
"""The percentiles printed per point (all of them go to the JSON)."""
KEPT_UP = 0.9
"""Measured throughput at least this share of the predicted one: the engine kept up as the plan said."""


@dataclass(frozen=True)
class VerifyPoint:
    """One rate the recommended policy is benched at."""

    name: str
    """`operating point`, `claimed capacity` or `past the claim`."""
    workload: Workload


def verify_points(workload: Workload, claimed_rps: float | None) -> list[VerifyPoint]:
    """The operating point, and (when the plan claimed a rate per replica) that rate and PAST_CLAIM times it."""
    points = [VerifyPoint("operating point", workload)]
    if claimed_rps:
        points.append(VerifyPoint("claimed capacity", with_rate(workload, claimed_rps)))
        points.append(VerifyPoint("past the claim", with_rate(workload, PAST_CLAIM * claimed_rps)))
    return points


def rate_text(workload: Workload) -> str:
    """The point's offered load in a few words."""
    if workload.arrival == "closed":
        return f"closed loop at concurrency {workload.concurrency}"
    return f"{workload.rate_rps:.3g} requests/s"


def compare_point(
    point: VerifyPoint, policy: ServedModel, model: LatencyModel, measured: dict[str, Any], lone_ratio: float | None
) -> dict[str, Any]:
    """Predicted (central and interval) against measured at one point; `lone_ratio` is the speed check run just
    before it (measured over expected lone latency)."""
    setup = sim_setup(policy)
    w = point.workload
    specs = make_requests(w, 0)
    concurrency = w.concurrency if w.arrival == "closed" else None
    interval = prediction_interval(setup, model, specs, concurrency=concurrency, seeds=VERIFY_SEEDS)
    predicted_rps = float(predict(setup, model, w).summary["throughput"]["requests_per_s"])
    measured_rps = float(measured["throughput"]["requests_per_s"])
    rows = []
    for metric, p in ((m, q) for m in ("ttft_ms", "tpot_ms", "e2el_ms") for q in ("p50", "p95", "p99")):
        got = float(measured[metric][p])
        central = interval.central[metric][p]
        rows.append(
            {
                "metric": f"{metric}.{p}",
                "predicted": central,
                "low": interval.low[metric][p],
                "high": interval.high[metric][p],
                "measured": got,
                "relative_error": (central - got) / got if got else float("nan"),
                "inside": interval.contains(metric, p, got),
            }
        )
    return {
        "point": point.name,
        "offered": rate_text(w),
        "rate_rps": w.rate_rps,
        "level": interval.level,
        "predicted_requests_per_s": predicted_rps,
        "measured_requests_per_s": measured_rps,
        "kept_up_as_predicted": measured_rps >= KEPT_UP * predicted_rps,
        "speed_check_ratio": lone_ratio,
        "comparison": rows,
    }


def point_rows(point: dict[str, Any]) -> list[tuple[str, ...]]:
    """The table rows of one point: throughput, then the compared percentiles."""
    speed = f"{point['speed_check_ratio']:.2f}x" if point["speed_check_ratio"] else "-"
    name = f"{point['point']} ({point['offered']}; machine {speed})"
    pr, mr = point["predicted_requests_per_s"], point["measured_requests_per_s"]
    rows: list[tuple[str, ...]] = [
        (
            name,
            "throughput (requests/s)",
            f"{pr:.3g}",
            "",
            f"{mr:.3g}",
            f"{100 * (pr - mr) / mr:+.1f}%" if mr else "-",
            "kept up" if point["kept_up_as_predicted"] else "FELL BEHIND",
        )
    ]
    wanted = {f"{m}.{p}" for m, p in COMPARED}
    for r in point["comparison"]:
        if r["metric"] in wanted:
            rows.append(
                (
                    name,
                    r["metric"].replace("_ms.", " "),
                    f"{r['predicted']:.1f}",
                    f"{r['low']:.1f}-{r['high']:.1f}",
                    f"{r['measured']:.1f}",
                    f"{100 * r['relative_error']:+.1f}%",
                    "inside" if r["inside"] else "OUTSIDE",
                )
            )
    return rows
