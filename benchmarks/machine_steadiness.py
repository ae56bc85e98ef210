"""How far apart two measurements of the same thing fall on this machine, and how much of it is the machine.

The same requests (same seed: arrivals, lengths, prompts) are sent `--runs` times in a row, open loop, to one
server of the manifest, while a Python loop is timed on every CPU (servegate/capacity/bench/machine_speed.py).
Per run: the p50 and mean end-to-end latency and the loop's median. Then the range of the p50s (no
prediction can be closer to every run than the runs are to each other), the correlation of each run's p50
with its loop time, and the p50s of the runs in which the machine ran fastest and slowest.

    python benchmarks/machine_steadiness.py --set runtime.threads=1 [--load 0.8 | --rate R] [--runs 20]
                                            [--requests 300] [--json results.json]

--load is a fraction of the knee that the manifest's saved profile predicts (`gate profile` first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from planner_accuracy import ROOT, measure  # the same client: this folder is on the path when run

from servegate.capacity.bench.local_server import LocalServer
from servegate.capacity.bench.machine_speed import MachineSpeedMonitor
from servegate.capacity.bench.workload import with_rate
from servegate.capacity.latency.prediction import load_profile, saturation_throughput, sim_setup
from servegate.contracts.loading import load_manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", default=str(ROOT / "examples/quickstart/manifest.yaml"))
    parser.add_argument("--set", action="append", default=[], dest="sets", help="PATH=VALUE override (repeatable)")
    parser.add_argument("--load", type=float, default=0.8, help="fraction of the profile's predicted knee")
    parser.add_argument("--rate", type=float, help="requests/s (instead of --load)")
    parser.add_argument("--requests", type=int, default=300, help="requests per run")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the runs as JSON to this path")
    args = parser.parse_args()

    served = load_manifest(Path(args.manifest), args.sets)
    if served.capacity.workload is None:
        raise SystemExit("the manifest declares no capacity.workload")
    base = served.capacity.workload.model_copy(update={"num_requests": args.requests})
    rate = args.rate
    if rate is None:
        model = load_profile(served)
        knee = saturation_throughput(sim_setup(served), model, base, num_requests=max(200, args.requests))
        rate = round(args.load * knee, 3)
        print(f"predicted knee {knee:.2f} requests/s; {args.load:g}x of it: {rate:.2f} requests/s")
    workload = with_rate(base, rate)

    rows: list[dict[str, Any]] = []
    began = time.time()
    with LocalServer(served) as server, MachineSpeedMonitor() as monitor:
        for i in range(args.runs):
            run = asyncio.run(measure(server.url, served, workload, args.seed))
            speed = monitor.summary(run.began_at, run.ended_at)
            e2el = run.summary["e2el_ms"]
            row = {"run": i + 1, "started_s": run.began_at - began, "p50_ms": e2el["p50"], "mean_ms": e2el["mean"]}
            row["probe_us"] = speed.probe_us if speed else None
            rows.append(row)
            loop = row["probe_us"] or float("nan")
            print(f"  run {i + 1}: p50 {e2el['p50']:.1f} ms, loop {loop:.0f} us", flush=True)

    p50s = [r["p50_ms"] for r in rows]
    loops = [r["probe_us"] for r in rows if r["probe_us"]]
    took = time.time() - began
    print(f"\n{args.runs} runs of the same {args.requests} requests at {rate:.2f} requests/s ({took:.0f} s)")
    print(f"{'run':>4}{'at (s)':>8}{'p50 (ms)':>10}{'mean (ms)':>11}{'loop (us)':>11}")
    for r in rows:
        loop = r["probe_us"] or 0
        print(f"{r['run']:>4}{r['started_s']:>8.1f}{r['p50_ms']:>10.1f}{r['mean_ms']:>11.1f}{loop:>11.0f}")
    spread = max(p50s) / min(p50s)
    print(f"p50: {min(p50s):.1f} to {max(p50s):.1f} ms ({spread:.2f}x), median {statistics.median(p50s):.1f} ms")
    summary: dict[str, Any] = {"rate_rps": rate, "requests": args.requests, "p50_spread": spread}
    if len(loops) == len(rows) and len(rows) >= 4:
        corr = float(np.corrcoef(loops, p50s)[0, 1])
        ordered = sorted(rows, key=lambda r: r["probe_us"])
        third = max(1, len(rows) // 3)
        fast, slow = ordered[:third], ordered[-third:]
        print(f"loop: {min(loops):.0f} to {max(loops):.0f} us ({max(loops) / min(loops):.2f}x); correlation of a "
              f"run's p50 with its loop time: {corr:+.2f}")  # fmt: skip
        fast_p50, slow_p50 = (statistics.median(r["p50_ms"] for r in group) for group in (fast, slow))
        print(f"the {third} runs with the fastest loop: p50 median {fast_p50:.1f} ms; the {third} slowest: "
              f"{slow_p50:.1f} ms")  # fmt: skip
        summary.update(correlation=corr, loop_spread=max(loops) / min(loops))
    within = sum(1 for x in p50s if abs(x - statistics.median(p50s)) <= 0.1 * x)
    print(f"runs within 10% of the median run: {within} of {len(rows)} (a prediction equal to that median is within "
          "10% of these only)")  # fmt: skip
    summary["runs_within_10pct_of_median"] = within
    if args.json:
        out = {"manifest": args.manifest, "sets": args.sets, "summary": summary, "runs": rows}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
