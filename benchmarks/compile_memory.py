"""What `runtime.compile` (decode or steps) costs in memory, against what `gate plan` counts for it.

Each configuration runs in a fresh process (one imported torch, no graph compiled before): the random Llama of
the runtime benchmarks is built, then a paged runner compiles the decode graphs of the given batch sizes (or, for
the configuration `steps`, the one dynamic-shape graph of `runtime.compile: steps`), then the
eager steps' linears are routed through oneDNN as the engine does (`apply_cpu_linear(..., compiled=True)` with
`cpu_linear: onednn`). The process's resident memory is read after each stage, and each growth is printed in MiB
and in copies of the model's linear weights, beside the copies `capacity/memory/plan.compiled_weights_bytes`
counts.

    .venv/bin/python benchmarks/compile_memory.py --dtypes float32 bfloat16 --sizes 1 1,2,3 steps --threads 2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

RESULT = "RESULT "
"""Prefix of the one line a configuration's process prints with its figures (JSON)."""


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else the platform's machine name)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def resident_mib() -> float:
    """The process's resident memory now, in MiB (/proc/self/statm)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(dtype_name: str, sizes: list[int], threads: int) -> dict[str, float]:
    """One configuration, in this process: resident MiB before compiling, after, and after routing. `sizes`
    empty: `runtime.compile: steps`."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from runner_decode import build_model

    from servegate.runtime.model.cpu_linear import apply_cpu_linear
    from servegate.runtime.model.model_runner import PagedModelRunner

    torch.set_num_threads(threads)
    model = build_model(getattr(torch, dtype_name))
    linear = sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, torch.nn.Linear))
    runner = PagedModelRunner(model, num_blocks=max(sizes, default=1) + 1, block_size=16)
    gc.collect()
    before = resident_mib()
    if sizes:
        runner._compile(sizes)
    else:
        runner._compile_steps()
    gc.collect()
    compiled = resident_mib()
    routed_layers = apply_cpu_linear(model, "onednn", threads, compiled=True)
    gc.collect()
    routed = resident_mib()
    return {
        "linear_mib": linear / 2**20,
        "before_mib": before,
        "compiled_mib": compiled,
        "routed_mib": routed,
        "routed_layers": routed_layers,
    }


def planned_copies(sizes: list[int], dtype_name: str, linear_mib: float) -> int:
    """The copies of the linear weights `gate plan` counts for these sizes beside `cpu_linear: onednn`."""
    from servegate.capacity.memory.plan import compiled_weights_bytes
    from servegate.contracts.sections import Runtime

    mode = "decode" if sizes else "steps"
    runtime = Runtime(compile=mode, compile_batch_sizes=sizes or [1], cpu_linear="onednn", dtype=dtype_name)
    linear = int(linear_mib * 2**20)
    return round(compiled_weights_bytes(runtime, linear, dtype_name) / linear)


def parse_sizes(spec: str) -> list[int]:
    """A configuration's batch sizes: `1,2,3` -> [1, 2, 3]; `steps` (compile: steps) -> []."""
    return [] if spec == "steps" else [int(s) for s in spec.split(",")]


def run_one(dtype_name: str, sizes: list[int], threads: int) -> dict[str, float]:
    """`measure` in a child process of its own; its figures."""
    child = subprocess.run(
        [sys.executable, __file__, "--child", dtype_name, ",".join(map(str, sizes)) or "steps", str(threads)],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in child.stdout.splitlines():
        if line.startswith(RESULT):
            return dict(json.loads(line.removeprefix(RESULT)))
    raise RuntimeError(f"the measuring process failed (exit {child.returncode}):\n{child.stderr[-3000:]}")


def main() -> None:
    """Measure every (dtype, sizes) configuration in turn and print one row each."""
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        sizes = parse_sizes(sys.argv[3])
        print(RESULT + json.dumps(measure(sys.argv[2], sizes, int(sys.argv[4]))), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=["1", "1,2,3", "steps"],
        help="comma-separated batch sizes of compile: decode, or steps for compile: steps; one configuration each",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average {load:.2f}; torch threads {args.threads}")
    print("dtype     sizes    linear   compiled: growth (copies)   routed: growth (copies)   plan counts")
    for dtype_name in args.dtypes:
        for spec in args.sizes:
            sizes = parse_sizes(spec)
            got = run_one(dtype_name, sizes, args.threads)
            linear = got["linear_mib"]
            grown = got["compiled_mib"] - got["before_mib"]
            routed = got["routed_mib"] - got["compiled_mib"]
            total = (grown + routed) / linear
            print(
                f"{dtype_name:9s} {spec:8s} {linear:6.0f} MiB   +{grown:6.0f} MiB ({grown / linear:.2f}, "
                f"{grown / linear / max(len(sizes), 1):.2f} a graph)   +{routed:5.0f} MiB ({routed / linear:.2f})   "
                f"{planned_copies(sizes, dtype_name, linear)} copies; measured {total:.2f}"
            )


if __name__ == "__main__":
    main()
