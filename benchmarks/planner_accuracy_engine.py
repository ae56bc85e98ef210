"""Planner accuracy for an engine servegate does not run itself (`runtime.backend: vllm` or `endpoint`): the
per-replica capacity against the measured knee, E2E latency at the operating point, and the coverage of the
stated 90% interval over repeated runs (#40).

`benchmarks/planner_accuracy.py` runs this for a remote manifest. The latency model is the saved black-box
profile (`gate profile`; `--reprofile` makes a fresh one). The manifest's engine is started once (or its
endpoint used), and then, `--repeats` times:
  1. the knee search of `gate profile` (latency/blackbox.py) against it: the rate kept up with, the rate
     missed, and the engine's pace past the knee (its measured capacity: the median of those runs' paces);
  2. the declared workload at its own rate, E2E p50 and p99 measured against the prediction (the median of
     the 90% interval's seeds, latency/interval.py). It sends at least the requests a 95% interval of a p99
     needs (`percentiles.interval_floor(99)`, 368): the quickstart declares 96, and 96 requests' p99 is their
     largest but one, which moved 126-359 ms between repeats of one run (2026-12-05). Each repeat's p99 is
     printed with its 95% interval, and whether the prediction falls inside it.
The plan's claim is the manifest's policy as the engine runs it: `planning/rate_limit.max_rate` with its 90%
interval. The claim is checked against the measured capacity when throughput binds (the targets hold up to
capacity); when a latency target binds the claimed rate lies below the knee by design, and only the interval
of the capacity itself (`saturation_throughput` widened the same way) is checked.
Targets (#40, on a quiet machine, median of the repeats): per-replica capacity within 15% of the measured
knee; E2E p50 within 15% and p99 within 25% at the operating point; 90% interval coverage >= 80%.

    python benchmarks/planner_accuracy.py --manifest examples/quickstart/manifest.yaml \
        --set runtime.backend=vllm --set runtime.device=cpu --set 'runtime.quantization={"method": "none"}' \
        --set runtime.kv_cache.block_size=32 --repeats 3 [--reprofile] [--json results.json]
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from servegate.capacity.bench.load_generator import run_open_loop
from servegate.capacity.bench.own_server import against_server, manifest_tokenizer, own_server
from servegate.capacity.bench.percentiles import interval_floor
from servegate.capacity.bench.run_metrics import summarize
from servegate.capacity.bench.targets import PromptFactory
from servegate.capacity.bench.workload import make_requests
from servegate.capacity.latency.blackbox import engine_setup, knee_sweep, profile_endpoint
from servegate.capacity.latency.interval import prediction_interval
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.prediction import load_profile, sim_setup
from servegate.capacity.latency.provenance import profile_path
from servegate.capacity.planning.rate_limit import max_rate
from servegate.contracts.manifest import ServedModel

TARGETS = {"capacity": 0.15, "e2el_ms.p50": 0.15, "e2el_ms.p99": 0.25, "coverage": 0.80}


def operating_workload(workload: Any) -> Any:
    """The declared workload with at least the requests a 95% interval of its p99 needs."""
    return workload.model_copy(update={"num_requests": max(workload.num_requests, interval_floor(99))})


def _model(served: ServedModel, reprofile: bool) -> LatencyModel:
    """The saved black-box profile, or a fresh one (saved for `gate plan` too)."""
    if not reprofile:
        return load_profile(served)
    model = profile_endpoint(served, repeats=2)
    model.save(profile_path(model.provenance.key, model.provenance.hardware))
    return model


async def _one_repeat(target: Any, served: ServedModel, model: LatencyModel, prompts: PromptFactory) -> dict[str, Any]:
    """One knee search and one run at the operating point (operating_workload's requests)."""
    workload = served.capacity.workload
    assert workload is not None
    sweep = await knee_sweep(target, prompts, engine_setup(served), model, workload)
    paces = sweep.saturated_rps()
    measured = summarize(
        await run_open_loop(target, make_requests(operating_workload(workload), 0), prompts), intervals=True
    )
    return {
        "kept_up_rps": sweep.measured_knee_rps,
        "missed_rps": sweep.missed_rps,
        "measured_capacity_rps": statistics.median(paces) if paces else None,
        "rates_run": len(sweep.rates),
        "e2el_ms": {p: float(measured["e2el_ms"][p]) for p in ("p50", "p99")},
        "e2el_p99_ci_ms": measured["e2el_ms"].get("p99_ci"),
        "requests": int(measured["requests"]["completed"]),
        "requests_per_s": float(measured["throughput"]["requests_per_s"]),
    }


def run(served: ServedModel, repeats: int, reprofile: bool) -> dict[str, Any]:
    """The claim, then `repeats` measured repeats, and the errors and coverage over them."""
    workload = served.capacity.workload
    if workload is None:
        raise SystemExit("the manifest declares no capacity.workload")
    began = time.time()
    model = _model(served, reprofile)
    setup = sim_setup(served)
    limit = max_rate(setup, model, workload, served.capacity.targets)
    predicted = prediction_interval(setup, model, make_requests(operating_workload(workload), 0))
    prompts = PromptFactory(manifest_tokenizer(served))
    rows = []
    with own_server(served) as server:
        for i in range(repeats):

            def action(target: Any) -> Any:
                return _one_repeat(target, served, model, prompts)

            rows.append(against_server(server.url, served, action))
            print(f"  repeat {i + 1}/{repeats}: {json.dumps(rows[-1])}", flush=True)
    box = model.fit.black_box
    if box is not None and box.stream is not None:
        for line in box.stream.lines():
            print(f"  profile's {line.strip()}", flush=True)
    return {
        "claim": limit.as_dict(),
        "drift": {"spread": model.jitter.drift_spread, "seconds": model.jitter.drift_seconds},
        "load_stretch_per_rps": model.overheads.load_stretch_per_rps,
        "predicted_e2el_ms": {p: predicted.central["e2el_ms"][p] for p in ("p50", "p99")},
        "rows": rows,
        "seconds": time.time() - began,
    }


def _rps(x: float | None) -> str:
    return "none" if x is None else f"{x:.3g}"


def _inside_ci(predicted: float, rows: list[dict[str, Any]]) -> tuple[int, int] | None:
    """(repeats whose measured p99 interval holds the prediction, repeats with an interval); None without any."""
    cis = [r["e2el_p99_ci_ms"] for r in rows if r.get("e2el_p99_ci_ms")]
    return (sum(lo <= predicted <= hi for lo, hi in cis), len(cis)) if cis else None


def report(result: dict[str, Any]) -> dict[str, Any]:
    """Print the figures against the targets; return them."""
    claim, rows = result["claim"], result["rows"]
    caps = [r["measured_capacity_rps"] for r in rows if r["measured_capacity_rps"]]
    bound = claim["binding"] == "throughput"
    cap_err = statistics.median((claim["capacity_rps"] - c) / c for c in caps) if caps else float("nan")
    inside = [claim["low_rps"] <= c <= claim["high_rps"] for c in caps] if bound else []
    e2e = {
        p: statistics.median((result["predicted_e2el_ms"][p] - r["e2el_ms"][p]) / r["e2el_ms"][p] for r in rows)
        for p in ("p50", "p99")
    }
    figures = {
        "per_replica_rps": claim["rate_rps"],
        "interval_rps": [claim["low_rps"], claim["high_rps"]],
        "binding": claim["binding"],
        "capacity_error_vs_knee": cap_err,
        "e2el_p50_error": e2e["p50"],
        "e2el_p99_error": e2e["p99"],
        "coverage": sum(inside) / len(inside) if inside else None,
        "repeats": len(rows),
        "e2el_p99_inside_measured_ci": _inside_ci(result["predicted_e2el_ms"]["p99"], rows),
    }
    print(f"per replica: {claim['rate_rps']:.3g} requests/s (90% interval {claim['low_rps']:.3g}-"
          f"{claim['high_rps']:.3g}; binds: {claim['binding']}); capacity {claim['capacity_rps']:.3g}")  # fmt: skip
    for i, r in enumerate(rows, 1):
        cap = r["measured_capacity_rps"]
        ci = r.get("e2el_p99_ci_ms")
        within = f" (95% interval {ci[0]:.1f}-{ci[1]:.1f} ms)" if ci else " (too few requests for its interval)"
        print(f"repeat {i}: knee between {_rps(r['kept_up_rps'])} and {_rps(r['missed_rps'])} requests/s; measured "
              f"capacity {_rps(cap)}; E2E p50 {r['e2el_ms']['p50']:.1f} ms, "
              f"p99 {r['e2el_ms']['p99']:.1f} ms{within} of {r.get('requests', '?')} requests")  # fmt: skip
    print(f"capacity vs measured knee (median): {100 * cap_err:+.1f}% (target within {100 * TARGETS['capacity']:.0f}%)")
    for p, key in (("p50", "e2el_ms.p50"), ("p99", "e2el_ms.p99")):
        print(f"E2E {p} at the operating point (median): {100 * e2e[p]:+.1f}% (target within "
              f"{100 * TARGETS[key]:.0f}%)")  # fmt: skip
    inside_ci = figures["e2el_p99_inside_measured_ci"]
    if inside_ci is not None:
        print(f"predicted E2E p99 {result['predicted_e2el_ms']['p99']:.1f} ms inside the measured p99's 95% interval: "
              f"{inside_ci[0]}/{inside_ci[1]} repeats")  # fmt: skip
    if figures["coverage"] is None:
        print("coverage: not checked (a latency target binds: the claimed rate is not the knee)")
    else:
        print(f"coverage of the 90% interval: {sum(inside)}/{len(inside)} repeats (target >= 80%)")
    return figures
