"""Planner accuracy: predicted against measured end-to-end latency at three loads (low, near the knee, overload).

1. The latency model of the manifest on this machine (`gate profile`; loaded if saved, --reprofile to redo).
2. The knee: the requests/s the manifest's own batching policy sustains in simulation (closed loop, requests
   always waiting). Loads: 0.3x (low), 0.8x (near the knee) and 1.3x (overload) of it.
3. At each load the simulator predicts p50 and p99 end-to-end latency for the exact requests (same seed,
   arrivals and lengths) that `gate bench` then sends to the manifest's own server (open loop, Poisson).
Targets below the knee: |error| <= 10% at p50 and <= 15% at p99. Before each load, `gate plan --verify`'s
speed check: 8 requests sent one at a time, measured p50 over the profile's (the `lone` column); and all along,
a Python loop timed on every CPU (servegate/capacity/bench/machine_speed.py): its median during the load's runs over
its median while the profile's traced runs were served (the `machine` column), so a row's error can be read
beside how fast the machine ran at that moment. `spread` is the largest over the smallest p50 of the load's
repeated runs: the same requests, so how far apart two measurements of one thing fall.

    python benchmarks/planner_accuracy.py [--manifest examples/quickstart/manifest.yaml] [--set runtime.threads=1]
                                          [--requests 300] [--repeats 3] [--reprofile] [--json results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from servegate.capacity.bench.load_generator import run_once
from servegate.capacity.bench.local_server import LocalServer
from servegate.capacity.bench.machine_speed import MachineSpeedMonitor
from servegate.capacity.bench.own_server import manifest_tokenizer
from servegate.capacity.bench.targets import HttpTarget, PromptFactory
from servegate.capacity.bench.workload import make_requests, with_rate
from servegate.capacity.latency.model import LatencyModel, hardware_id, profile_path
from servegate.capacity.latency.prediction import profile_key, saturation_throughput, sim_setup
from servegate.capacity.latency.profile import profile_manifest
from servegate.capacity.latency.simulate import simulate
from servegate.capacity.latency.speed_check import lone_workload, predicted_lone_e2e_ms, profile_lone_bias
from servegate.contracts.loading import load_manifest

ROOT = Path(__file__).resolve().parents[1]
LOADS = (("low", 0.3), ("near knee", 0.8), ("overload", 1.3))
TARGETS = {"p50": 0.10, "p99": 0.15}


def latency_model(served: Any, reprofile: bool) -> LatencyModel:
    """The saved profile, or a fresh one (saved for gate plan too)."""
    path = profile_path(profile_key(served), hardware_id())
    if path.is_file() and not reprofile:
        print(f"latency model: {path}")
        return LatencyModel.load(path)
    print("profiling (model steps, then serving overheads through the manifest's server)...")
    model = profile_manifest(served)
    model.save(profile_path(model.key, model.hardware))
    return model


async def measure(url: str, served: Any, workload: Any, seed: int) -> Any:
    target = HttpTarget.for_manifest(url, served)
    try:
        await target.probe()
        return await run_once(target, workload, PromptFactory(manifest_tokenizer(served)), seed=seed)
    finally:
        await target.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", default=str(ROOT / "examples/quickstart/manifest.yaml"))
    parser.add_argument("--set", action="append", default=[], dest="sets", help="PATH=VALUE override (repeatable)")
    parser.add_argument("--requests", type=int, default=300, help="requests per load")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="bench runs per load (the median is compared)")
    parser.add_argument("--reprofile", action="store_true")
    parser.add_argument("--json", help="write the table as JSON to this path")
    args = parser.parse_args()

    served = load_manifest(Path(args.manifest), args.sets)
    if served.capacity.workload is None:
        raise SystemExit("the manifest declares no capacity.workload")
    began = time.time()
    model = latency_model(served, args.reprofile)
    setup = sim_setup(served)
    base = served.capacity.workload.model_copy(update={"num_requests": args.requests})
    knee = saturation_throughput(setup, model, base, num_requests=max(200, args.requests))
    print(f"manifest {served.name} ({served.batching.mode}, max_batch_size {served.batching.max_batch_size}); "
          f"predicted knee {knee:.2f} requests/s")  # fmt: skip

    rows: list[dict[str, Any]] = []
    lone = lone_workload(base)
    lone_expected = predicted_lone_e2e_ms(served, model, lone, args.seed) * profile_lone_bias(model)
    profiled = model.fit.get("machine_speed")
    with LocalServer(served) as server, MachineSpeedMonitor() as monitor:
        for name, factor in LOADS:
            workload = with_rate(base, round(factor * knee, 3))
            specs = make_requests(workload, args.seed)
            sims = [simulate(setup, model, specs, seed=s).summary()["e2el_ms"] for s in range(5)]
            predicted = {p: statistics.median(s[p] for s in sims) for p in TARGETS}
            # the speed check of gate plan --verify: lone requests say how fast the machine is right now
            alone = asyncio.run(measure(server.url, served, lone, args.seed)).summary["e2el_ms"]["p50"]
            speed = alone / lone_expected
            bench_runs = [asyncio.run(measure(server.url, served, workload, args.seed)) for _ in range(args.repeats)]
            runs = [r.summary for r in bench_runs]
            row: dict[str, Any] = {"load": name, "rate_rps": workload.rate_rps, "lone_measured_over_expected": speed}
            machine = monitor.summary(bench_runs[0].began_at, bench_runs[-1].ended_at)
            row["machine_probe_us"] = machine.probe_us if machine else None
            row["machine_spread"] = machine.spread if machine else None
            row["machine_over_profile"] = machine.relative_to(profiled) if machine and profiled else None
            row["completed"] = [r["requests"]["completed"] for r in runs]
            row["measured_p50_ms_each"] = [r["e2el_ms"]["p50"] for r in runs]  # the spread is the measurement noise
            row["measured_p99_ms_each"] = [r["e2el_ms"]["p99"] for r in runs]
            row["repeat_spread_p50"] = max(row["measured_p50_ms_each"]) / min(row["measured_p50_ms_each"])
            for p in TARGETS:
                got = statistics.median(r["e2el_ms"][p] for r in runs)  # the same requests, sent `repeats` times
                row[f"predicted_{p}_ms"] = predicted[p]
                row[f"measured_{p}_ms"] = got
                row[f"error_{p}"] = (predicted[p] - got) / got
            row["within_target"] = all(abs(row[f"error_{p}"]) <= t for p, t in TARGETS.items())
            rows.append(row)
            print(f"  {name}: done")

    print(f"\nplanner accuracy, end-to-end latency, {args.requests} requests per load ({time.time() - began:.0f} s)")
    columns = (("load", "<11"), ("req/s", ">7"), ("pred p50", ">10"), ("meas p50", ">10"), ("err", ">8"))
    columns += (("pred p99", ">10"), ("meas p99", ">10"), ("err", ">8"), ("  lone", ">7"), ("machine", ">9"))
    columns += (("spread", ">8"), ("  measured p50 in each run", ""))
    print("".join(f"{name:{fmt}}" for name, fmt in columns))
    for r in rows:
        machine = f"{r['machine_over_profile']:>8.2f}x" if r["machine_over_profile"] else f"{'-':>9}"
        print(
            f"{r['load']:<11}{r['rate_rps']:>7.2f}{r['predicted_p50_ms']:>10.1f}{r['measured_p50_ms']:>10.1f}"
            f"{100 * r['error_p50']:>+7.1f}%{r['predicted_p99_ms']:>10.1f}{r['measured_p99_ms']:>10.1f}"
            f"{100 * r['error_p99']:>+7.1f}%{r['lone_measured_over_expected']:>6.2f}x{machine}"
            f"{r['repeat_spread_p50']:>7.2f}x  " + ", ".join(f"{x:.1f}" for x in r["measured_p50_ms_each"])
        )
    below = [r for r in rows if r["load"] != "overload"]
    ok = all(r["within_target"] for r in below)
    print(f"below the knee: p50 within 10% and p99 within 15%: {'yes' if ok else 'NO'}")
    print("lone: p50 end-to-end of 8 requests sent one at a time just before the load, measured / expected (the "
          "profile's prediction x how such requests ran against it when profiled; gate plan --verify's speed check: "
          "above 1, the machine is slower than when it was profiled)")  # fmt: skip
    print("machine: a Python loop's median time on every CPU during the load's runs over its median while the "
          "profile's traced runs were served (above 1: slower now); spread: largest over smallest p50 of the "
          "load's repeated runs of the same requests")  # fmt: skip
    if args.json:
        out = {"manifest": args.manifest, "sets": args.sets, "knee_rps": knee, "hardware": model.hardware, "rows": rows}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
