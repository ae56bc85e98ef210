"""Batch-1 decode through the engine with an idle fallback engine beside it, on threads as declared or shared.

The primary is the random Llama of benchmarks/runner_decode.py (134M parameters, float32) in the engine of
benchmarks/runtime_throughput.py (continuous batching, decode steps of one sequence compiled unless
--eager), on --threads torch threads. Beside it, the quickstart's fallback engine (examples/quickstart/
fallback.yaml, 2 threads declared) is started and left idle, as a server holds it until a request overflows.
Three setups, each in its own process (torch's thread pools live as long as the process), alternating for
--rounds rounds:

    none      no fallback engine
    declared  the fallback on the threads its manifest declares
    shared    the fallback as servegate.runtime.build starts it beside a primary: at most the cores the
              primary's threads leave (runtime/failure_policy/shared_cores.py)

For each: output tokens/s of one request decoding 64 tokens alone (--solo-runs times); the median per process,
then the median over the rounds and its ratio to `none`.

    .venv/bin/python benchmarks/fallback_threads.py [--threads 2] [--rounds 2] [--solo-runs 5] [--eager]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
SETUPS = ("none", "declared", "shared")


def child(setup: str, threads: int, solo_runs: int, eager: bool) -> list[float]:
    """In this process: start the setup, return the batch-1 tokens/s of each solo run."""
    import torch
    from runtime_throughput import batch1_decode_tokens_per_s, build_model, on_passing_thread, servegate_engine

    from servegate.contracts.loading import load_fallback, load_manifest
    from servegate.runtime import build
    from servegate.runtime.engine.fallback_route import FallbackRoute
    from servegate.runtime.failure_policy.shared_cores import beside_primary

    model = on_passing_thread(lambda: build_model(torch.float32), threads)
    engine = servegate_engine(model, "continuous", 16, 256 * 2**20, 512, threads, "torch", None if eager else [1])
    fallback = None
    if setup != "none":
        declared = load_fallback(load_manifest(ROOT / "examples/quickstart/manifest.yaml"))
        # the primary here is the benchmark's engine: share the cores its manifest's threads leave
        fallback = build(beside_primary(engine.served, declared) if setup == "shared" else declared, fallback=False)
        fallback.start_sync()  # loads its model on its own loop thread, as beside a served primary
        engine.fallback_route = FallbackRoute(fallback, ["overload"])  # held, as a server holds it; never used here
        print(f"fallback on {fallback.served.runtime.threads} thread(s)", file=sys.stderr)
    rates = [batch1_decode_tokens_per_s(engine) for _ in range(solo_runs)]
    engine.shutdown_sync(1.0)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="the primary's torch threads")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--solo-runs", type=int, default=5)
    parser.add_argument("--eager", action="store_true", help="no compiled decode steps")
    parser.add_argument("--child", choices=SETUPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.threads, args.solo_runs, args.eager)))
        return

    medians: dict[str, list[float]] = {s: [] for s in SETUPS}
    for round_ in range(args.rounds):
        for setup in SETUPS:
            cmd = [sys.executable, __file__, "--child", setup, "--threads", str(args.threads)]
            cmd += ["--solo-runs", str(args.solo_runs)] + (["--eager"] if args.eager else [])
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rates = json.loads(out.strip().splitlines()[-1])
            medians[setup].append(statistics.median(rates))
            runs = ", ".join(f"{r:.1f}" for r in rates)
            print(f"round {round_ + 1} {setup:9s} {runs} tokens/s (median {medians[setup][-1]:.1f})", flush=True)
    base = statistics.median(medians["none"])
    print(f"\nbatch-1 decode through the engine, median over {args.rounds} rounds ({args.threads} primary threads):")
    for setup in SETUPS:
        got = statistics.median(medians[setup])
        print(f"  {setup:9s} {got:6.1f} tokens/s  {got / base:.2f}x of none")


if __name__ == "__main__":
    main()
