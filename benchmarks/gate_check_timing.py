"""Wall time of `gate check` on a manifest, cold (empty baseline cache) and warm (baseline outputs cached).

Each run is a fresh process, as `make demo` and CI run it, so imports and model loading are counted.
The cold run uses an empty $SERVEGATE_CACHE; the warm run reuses the cache the cold run filled.

    python benchmarks/gate_check_timing.py [examples/quickstart/manifest.yaml] [--cpus 0,1] [--repeat 1]

--cpus pins the runs to those CPU cores (taskset), e.g. 0,1 for the "2 cores" budget.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(manifest: Path, cache: Path, cpus: str | None, report: Path) -> tuple[float, int]:
    """One `gate check` in a fresh process; returns (wall seconds, exit code)."""
    command = [sys.executable, "-m", "servegate.cli", "check", str(manifest), "--json", str(report)]
    if cpus:
        command = ["taskset", "-c", cpus, *command]
    env = {**os.environ, "SERVEGATE_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode not in (0, 1):
        sys.stderr.write(done.stderr)
        raise SystemExit(f"gate check failed to run (exit {done.returncode})")
    return wall, done.returncode


def main() -> None:
    """Measure and print cold and warm wall times side by side."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("manifest", nargs="?", default="examples/quickstart/manifest.yaml")
    parser.add_argument("--cpus", default=None, help="CPU list for taskset, e.g. 0,1")
    parser.add_argument("--repeat", type=int, default=1, help="cold/warm pairs to run")
    args = parser.parse_args()
    if args.cpus and shutil.which("taskset") is None:
        raise SystemExit("--cpus needs taskset (util-linux)")
    manifest = (ROOT / args.manifest).resolve()
    machine = platform.processor() or platform.machine()
    print(f"machine: {machine}, {os.cpu_count()} CPUs visible, pinned to {args.cpus or 'none'}")
    rows = []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="servegate-bench-") as tmp:
            cache, report = Path(tmp) / "cache", Path(tmp) / "report.json"
            cold, code = run_once(manifest, cache, args.cpus, report)
            verdicts = {g["name"]: g["verdict"] for g in json.loads(report.read_text())["gates"]}
            warm, _ = run_once(manifest, cache, args.cpus, report)
            rows.append((cold, warm))
            ratio = warm / cold
            print(f"run {i + 1}: cold {cold:.1f} s, warm {warm:.1f} s, warm/cold {ratio:.2f} (exit {code}: {verdicts})")
    best_cold, best_warm = min(r[0] for r in rows), min(r[1] for r in rows)
    print(f"best: cold {best_cold:.1f} s (budget 60 s), warm {best_warm:.1f} s (budget 30 s)")


if __name__ == "__main__":
    main()
