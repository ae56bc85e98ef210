"""torch threads against neighbours: the same server at 1 and 2 threads, benched interleaved, with CPU hogs beside.

Two servers of the manifest (default: examples/quickstart/unsafe-truncation.yaml, the case of issue 33) run
side by side, one per `--threads` value, each writing its engine's step trace. For each condition

    quiet    nothing started beside the bench (whatever else the machine runs)
    nice19   two processes spinning a core each at nice 19 (the issue's "compilers on the other core")
    nice0    the same two at normal priority

the script benches the servers in turn, A B then B A, for `--rounds` rounds (the manifest's own workload each
time) and prints, per server: e2e p50, TPOT p50 and p95, the engine's step time p50 and p90 (ms), the
contention probe's team/one-thread ratio (servegate/capacity/bench/contention.py), the share of time the
server's threads waited for a core, and the Python loop's spread (machine_speed.py). Then the median over
the rounds with the range, per condition and thread count.

    .venv/bin/python benchmarks/thread_contention.py [--manifest M] [--threads 1 2] [--rounds 3]
        [--conditions quiet nice19 nice0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from servegate.capacity.bench.contention import ContentionProbe, judge_contention, run_queue_times, wait_share_between
from servegate.capacity.bench.local_server import LocalServer
from servegate.capacity.bench.own_server import bench_url, manifest_tokenizer
from servegate.contracts.loading import load_manifest

ROOT = Path(__file__).resolve().parents[1]
HOG = "while True: pass"


def step_ms(trace: Path, since: float) -> list[float]:
    """Durations (ms) of the engine steps that began after `since` (perf_counter seconds)."""
    out = []
    for line in trace.read_text().splitlines():
        record = json.loads(line)
        if "began" in record and record["began"] >= since:
            out.append(1000 * (record["ended"] - record["began"]))
    return sorted(out)


def q(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(p * len(values)))] if values else float("nan")


def hogs(condition: str) -> list[subprocess.Popen[bytes]]:
    """Two processes spinning a core each (nice 19 or 0), none for `quiet`."""
    if condition == "quiet":
        return []
    nice = ["nice", "-n", "19"] if condition == "nice19" else []
    return [subprocess.Popen([*nice, sys.executable, "-c", HOG]) for _ in range(2)]


def bench_one(server: LocalServer, trace: Path, probe: ContentionProbe, served: Any, tokenizer: Any) -> dict[str, Any]:
    """One bench of the manifest's workload against `server`, with what the probes saw meanwhile."""
    since, began = time.perf_counter(), time.time()
    pid = server.pid or 0
    before = run_queue_times(pid)
    report = bench_url(server.url, served.capacity.workload, served=served, tokenizer=tokenizer).as_dict()
    contention = judge_contention(probe.samples_between(began, time.time()), probe.threads,
                                  wait_share_between(before, run_queue_times(pid)))  # fmt: skip
    steps = step_ms(trace, since)
    return {
        "e2e_p50": report["e2el_ms"]["p50"],
        "tpot_p50": report["tpot_ms"]["p50"],
        "tpot_p95": report["tpot_ms"]["p95"],
        "steps": len(steps),
        "step_p50": q(steps, 0.5),
        "step_p90": q(steps, 0.9),
        "team_over_single": contention.team_over_single,
        "wait_share": contention.wait_share,
        "contended": contention.contended,
        "loop_spread": report["machine_speed"]["spread"],
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", default=str(ROOT / "examples/quickstart/unsafe-truncation.yaml"))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--conditions", nargs="+", default=["quiet", "nice19", "nice0"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    base = load_manifest(Path(args.manifest))
    tokenizer = manifest_tokenizer(base)
    tmp = Path(tempfile.mkdtemp(prefix="thread-contention-"))
    servers: dict[int, tuple[LocalServer, Path, Any, ContentionProbe]] = {}
    for t in args.threads:
        served = base.with_changes(runtime={**base.runtime.model_dump(mode="python"), "threads": t})
        trace = tmp / f"steps-{t}.jsonl"
        servers[t] = (LocalServer(served, step_trace=trace).launch(), trace, served, ContentionProbe(t).launch())
    rows: list[dict[str, Any]] = []
    try:
        for server, _, _, probe in servers.values():
            server.start()
            probe.begin()
        for t, (server, *_rest) in servers.items():
            assert server._proc is not None
            print(f"threads={t}: server pid {server._proc.pid}, {len(os.listdir(f'/proc/{server._proc.pid}/task'))} "
                  "OS threads", flush=True)  # fmt: skip
        for condition in args.conditions:
            started = hogs(condition)
            try:
                time.sleep(0.5)
                for r in range(args.rounds):
                    for t in args.threads if r % 2 == 0 else list(reversed(args.threads)):
                        server, trace, served, probe = servers[t]
                        row = {"condition": condition, "round": r, "threads": t,
                               **bench_one(server, trace, probe, served, tokenizer)}  # fmt: skip
                        rows.append(row)
                        print(
                            json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}),
                            flush=True,
                        )
            finally:
                for hog in started:
                    hog.kill()
                    hog.wait()
    finally:
        for server, _, _, probe in servers.values():
            server.stop()
            probe.stop()
    print("\ncondition threads: median (min-max) over rounds")
    for condition in args.conditions:
        for t in args.threads:
            sel = [r for r in rows if r["condition"] == condition and r["threads"] == t]
            cells = []
            for key in ("e2e_p50", "tpot_p50", "tpot_p95", "step_p50", "step_p90", "team_over_single", "wait_share"):
                values = [r[key] for r in sel if r[key] is not None]
                if values:
                    cells.append(f"{key} {statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})")
            contended = sum(r["contended"] for r in sel)
            print(f"{condition} {t}: " + ", ".join(cells) + f", contended {contended}/{len(sel)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
