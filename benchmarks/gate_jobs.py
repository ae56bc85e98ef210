"""`gate check --jobs`: wall time of the same check in one process and in several, alternating, and whether every
gate's verdict and measurements agree.

Each run is a fresh `gate check` process with an empty baseline cache (so every run generates the same outputs),
pinned with --cpus; the job counts alternate within each round (1 2, 2 1, ...) so a slow stretch of the machine
falls on both. Prints each run, the median wall time per job count with its range, the ratio of the medians, and
the gates whose results differed between any two runs, times and rates aside (none expected: the gates beside
others time nothing).

    python benchmarks/gate_jobs.py examples/smollm2/manifest.yaml --cpus 0,1 --rounds 2 -- \\
        --gate truncation --gate batching --gate load --set runtime.threads=1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from gate_check_timing import run_once

TIMES = ("_s", "_ms", "_rps")
"""Endings of the fields that are times or rates (the load gate's `load_phase_s`, `throughput_rps`): they differ
from run to run whatever the processes, so the comparison leaves them out."""


def untimed(value: Any) -> Any:
    """A report's record without the fields that are times or rates, at any depth."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not k.endswith(TIMES)}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def outcome(report: Path) -> dict[str, Any]:
    """Gate name -> its JSON record without its times (its wall time included)."""
    data = json.loads(report.read_text())
    return {g["name"]: untimed(g) for g in data["gates"]}


def main() -> None:
    """Alternate the job counts, then print the medians, their ratio and any gate whose results moved."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--jobs", default="1,2", help="job counts to compare, comma-separated (default 1,2)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each runs every job count once")
    parser.add_argument("--cpus", default=None, help="CPU list for taskset, e.g. 0,1")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    extra = argv[split + 1 :]  # after --: more arguments for gate check
    counts = [c.strip() for c in args.jobs.split(",") if c.strip()]
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs visible, pinned to {args.cpus or 'none'}")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    walls: dict[str, list[float]] = {c: [] for c in counts}
    seen: dict[str, dict[str, Any]] = {}
    moved: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="gate-jobs-") as scratch:
        for r in range(args.rounds):
            order = counts if r % 2 == 0 else counts[::-1]
            for count in order:
                where = Path(scratch) / f"r{r}-j{count}"
                report = where / "report.json"
                where.mkdir()
                wall, cpu, code = run_once(
                    args.manifest, where / "cache", args.cpus, report, extra_args=["--jobs", count, *extra]
                )
                walls[count].append(wall)
                gates = outcome(report)
                for name, record in gates.items():
                    if name in seen and seen[name] != record:
                        moved.add(name)
                    seen.setdefault(name, record)
                verdicts = ", ".join(f"{n} {g['verdict']}" for n, g in gates.items() if g["verdict"] != "skipped")
                print(f"round {r + 1}, --jobs {count}: wall {wall:.1f} s, CPU {cpu:.1f} s, exit {code} ({verdicts})")
    medians = {c: statistics.median(w) for c, w in walls.items()}
    for count, values in walls.items():
        spread = f"range {min(values):.1f}-{max(values):.1f}"
        print(f"--jobs {count}: median {medians[count]:.1f} s ({spread}) over {len(values)} runs")
    first = counts[0]
    for count in counts[1:]:
        print(
            f"--jobs {count} against --jobs {first}: {medians[first] / medians[count]:.2f}x faster (ratio of medians)"
        )
    print("gates whose results differed between runs: " + (", ".join(sorted(moved)) or "none"))


if __name__ == "__main__":
    main()
