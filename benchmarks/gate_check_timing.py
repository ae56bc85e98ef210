"""Wall time of `gate check` on a manifest, cold (empty baseline cache) and warm (baseline outputs cached).

Each run is a fresh process, as `make demo` and CI run it, so imports and model loading are counted.
The cold run uses an empty $SERVEGATE_CACHE; the warm run reuses the cache the cold run filled.

    python benchmarks/gate_check_timing.py [examples/quickstart/manifest.yaml] [--cpus 0,1] [--repeat 1]
    python benchmarks/gate_check_timing.py examples/smollm2/manifest.yaml --candidate examples/smollm2/int8.yaml

With --candidate it times `gate check --baseline MANIFEST --candidate CANDIDATE` (a change), else `gate check
MANIFEST` (the manifest against its reference form). Peak resident memory of the check is printed too.

--cpus pins the runs to those CPU cores (taskset), e.g. 0,1 for the "2 cores" budget.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(
    manifest: Path,
    cache: Path,
    cpus: str | None,
    report: Path,
    candidate: Path | None = None,
    extra_args: list[str] | None = None,
) -> tuple[float, float, int]:
    """One `gate check` in a fresh process (with `extra_args` after its own); returns (wall seconds, CPU seconds
    user+sys, exit code).

    CPU time is what the run costs whatever else the machine is doing; wall time also counts waiting for
    cores that other processes hold.
    """
    sides = [str(manifest)] if candidate is None else ["--baseline", str(manifest), "--candidate", str(candidate)]
    command = [sys.executable, "-m", "servegate.cli", "check", *sides, "--json", str(report), *(extra_args or [])]
    if cpus:
        command = ["taskset", "-c", cpus, *command]
    env = {**os.environ, "SERVEGATE_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in (0, 1):
        sys.stderr.write(done.stderr)
        raise SystemExit(f"gate check failed to run (exit {done.returncode})")
    return wall, cpu, done.returncode


def main() -> None:
    """Measure and print cold and warm wall times side by side."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("manifest", nargs="?", default="examples/quickstart/manifest.yaml")
    parser.add_argument("--cpus", default=None, help="CPU list for taskset, e.g. 0,1")
    parser.add_argument("--repeat", type=int, default=1, help="cold/warm pairs to run")
    parser.add_argument("--candidate", default=None, help="time a change: MANIFEST -> CANDIDATE")
    args = parser.parse_args()
    if args.cpus and shutil.which("taskset") is None:
        raise SystemExit("--cpus needs taskset (util-linux)")
    manifest = (ROOT / args.manifest).resolve()
    candidate = (ROOT / args.candidate).resolve() if args.candidate else None
    machine = platform.processor() or platform.machine()
    print(f"machine: {machine}, {os.cpu_count()} CPUs visible, pinned to {args.cpus or 'none'}")
    rows = []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="servegate-bench-") as tmp:
            cache, report = Path(tmp) / "cache", Path(tmp) / "report.json"
            load = os.getloadavg()[0]
            cold, cold_cpu, code = run_once(manifest, cache, args.cpus, report, candidate)
            gates = {g["name"]: (g["verdict"], g["duration_s"]) for g in json.loads(report.read_text())["gates"]}
            warm, warm_cpu, _ = run_once(manifest, cache, args.cpus, report, candidate)
            warm_gates = {g["name"]: g["duration_s"] for g in json.loads(report.read_text())["gates"]}
            rows.append((cold, warm, cold_cpu, warm_cpu))
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB on Linux -> GiB
            print(f"run {i + 1} (load average {load:.1f} at start): exit {code}; peak RSS of a check {peak:.2f} GiB")
            print(f"  cold: wall {cold:.1f} s, CPU {cold_cpu:.1f} s")
            print(f"  warm: wall {warm:.1f} s, CPU {warm_cpu:.1f} s (CPU warm/cold {warm_cpu / cold_cpu:.2f})")
            for name, (verdict, seconds) in gates.items():
                print(f"    {name:<13} {verdict:<8} cold {seconds:6.1f} s   warm {warm_gates.get(name, 0.0):6.1f} s")
    cold, warm = min(r[0] for r in rows), min(r[1] for r in rows)
    cold_cpu, warm_cpu = min(r[2] for r in rows), min(r[3] for r in rows)
    print(f"best cold: {cold:.1f} s wall, {cold_cpu:.1f} s CPU (budget 60 s wall)")
    print(f"best warm: {warm:.1f} s wall, {warm_cpu:.1f} s CPU (budget 30 s wall)")


if __name__ == "__main__":
    main()
