"""How long a `gate` process takes to end after its command returns: the interpreter's normal exit against
`servegate.cli.process_exit.run_then_exit` (exit handlers, flushed streams, no module teardown).

Each run is a fresh process of the same command. The child notes `time.monotonic()` (one clock for every
process on Linux) when the command returns; the parent notes it when the process has ended. The difference is
the exit's tail, which the command's own work cannot blur, so a few rounds decide it even on a noisy machine.
The two exits alternate (normal, fast, normal, fast, ...).

    python benchmarks/process_exit.py [--rounds 5] [--cpus 0,1] [-- check examples/quickstart/manifest.yaml]

The default command is a warm `gate check` of the quickstart (a first, untimed run fills its baseline cache).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the command in-process, noting when it returns; then the exit under test
CHILD = """
import os, sys, time
from servegate.cli.app import main
from servegate.cli.process_exit import exit_status, run_then_exit

def timed():
    try:
        main()
    finally:
        with open(os.environ["EXIT_BENCH_MARK"], "w") as mark:
            mark.write(repr(time.monotonic()))

sys.argv = ["gate", *sys.argv[1:]]
if os.environ["EXIT_BENCH_MODE"] == "fast":
    run_then_exit(timed)
try:
    timed()
except SystemExit as done:
    sys.exit(exit_status(done.code))
"""


def run(mode: str, command: list[str], cpus: str | None, env: dict[str, str], mark: Path) -> tuple[float, float]:
    """One process of `command` ending the `mode` way; returns (exit tail seconds, wall seconds)."""
    argv = [sys.executable, "-c", CHILD, *command]
    if cpus:
        argv = ["taskset", "-c", cpus, *argv]
    began = time.monotonic()
    done = subprocess.run(
        argv, cwd=ROOT, env={**env, "EXIT_BENCH_MODE": mode, "EXIT_BENCH_MARK": str(mark)}, capture_output=True
    )
    ended = time.monotonic()
    if done.returncode not in (0, 1):
        sys.stderr.write(done.stderr.decode(errors="replace"))
        raise SystemExit(f"the command failed to run (exit {done.returncode})")
    return ended - float(mark.read_text()), ended - began


def spread(values: list[float]) -> str:
    """Median with min-max, in seconds."""
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    """Alternate the two exits and print each run, then medians and the saving."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="runs of each exit, alternating")
    parser.add_argument("--cpus", default=None, help="CPU list for taskset, e.g. 0,1")
    parser.add_argument("command", nargs="*", default=["check", "examples/quickstart/manifest.yaml"])
    args = parser.parse_args()
    if args.cpus and shutil.which("taskset") is None:
        raise SystemExit("--cpus needs taskset (util-linux)")
    with tempfile.TemporaryDirectory(prefix="servegate-exit-") as tmp:
        env = {**os.environ, "SERVEGATE_CACHE": str(Path(tmp) / "cache"), "HF_HUB_OFFLINE": "1"}
        env["TRANSFORMERS_OFFLINE"] = "1"
        mark = Path(tmp) / "returned"
        run("normal", args.command, args.cpus, env, mark)  # fills the baseline cache: every timed run is warm
        tails: dict[str, list[float]] = {"normal": [], "fast": []}
        walls: dict[str, list[float]] = {"normal": [], "fast": []}
        print(f"gate {' '.join(args.command)}, {os.cpu_count()} CPUs visible, pinned to {args.cpus or 'none'}")
        for i in range(args.rounds):
            for mode in ("normal", "fast"):
                load = os.getloadavg()[0]
                tail, wall = run(mode, args.command, args.cpus, env, mark)
                tails[mode].append(tail)
                walls[mode].append(wall)
                print(f"round {i + 1} {mode:<6} load {load:.1f}: exit tail {tail:.2f} s, wall {wall:.1f} s")
    for mode in ("normal", "fast"):
        print(f"{mode:<6} exit tail {spread(tails[mode])}, wall {spread(walls[mode])}")
    saved = statistics.median(tails["normal"]) - statistics.median(tails["fast"])
    print(f"saved per process: {saved:.2f} s (median tails)")


if __name__ == "__main__":
    main()
