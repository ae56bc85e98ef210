"""`runtime.compile: steps` (one graph with dynamic shapes for every step of two or more sequences) against the eager
oneDNN steps.

`runtime.compile: decode` compiles one static graph per batch size, with inductor's C++ GEMM template: far faster
at 1-6 sequences, slower from 32 on (benchmarks/README.md). This script measures the other design,
runtime/model/compiled_steps.py: the paged runner's whole forward compiled once by torch inductor with dynamic
shapes, in its default mode with the weights frozen (so its weight prepacking hands the linears to oneDNN/MKL packed
kernels, as `cpu_linear: onednn` does eagerly) and every small op between the products fused. Prefills and decode
steps of any size run the same graph; paged attention stays the opaque custom op of compiled_decode.py.

Two copies of the random 134M Llama, each with the decode attention kernel: one routed through oneDNN
(`cpu_linear: onednn`, fused projections), one built as `compile: steps` (its eager steps, those of one sequence,
routed likewise afterwards, as the engine does). For each batch size the same 128-token prompts are prefilled in
one step and decoded greedily; rounds alternate (eager, compiled, ...), and the median decode step and the prefill
of each round are printed with whether both copies chose the same greedy tokens. A batch of one runs eagerly in both
copies (the mode leaves one sequence to the eager path), so its ratio shows the routing alone.

    .venv/bin/python benchmarks/compiled_steps.py --dtypes float32 bfloat16 --batches 1 8 32 64 --rounds 3
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from compile_memory import resident_mib  # noqa: E402
from runner_decode import build_model, greedy_round  # noqa: E402

from servegate.runtime.model.decode_kernel import load_decode_kernel  # noqa: E402
from servegate.runtime.model.fused_linear import route_linears_onednn  # noqa: E402
from servegate.runtime.model.model_runner import PagedModelRunner  # noqa: E402


def main() -> None:
    """Per dtype and batch size: both designs' decode step and prefill, medians (min-max) over the rounds."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24, help="decode steps per round")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernel = load_decode_kernel()
    print(f"{args.threads} torch threads, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    for dtype_name in args.dtypes:
        base = build_model(getattr(torch, dtype_name))
        blocks = max(args.batches) * -(-(128 + args.steps + 1) // 16)
        runners: dict[str, PagedModelRunner] = {}
        for name in ("eager", "compiled"):
            model = copy.deepcopy(base)
            before, began = resident_mib(), time.perf_counter()
            compiled = name == "compiled"
            runner = PagedModelRunner(
                model, num_blocks=blocks, block_size=16, decode_kernel=kernel, compile_steps=compiled
            )
            route_linears_onednn(model)  # after the graph is built, as engine/parts.py routes
            grown = resident_mib() - before
            print(f"{dtype_name} {name}: ready in {time.perf_counter() - began:.0f} s, process +{grown:.0f} MiB")
            runners[name] = runner
        del base
        gen = torch.Generator().manual_seed(1)
        for batch in args.batches:
            prompts = torch.randint(10, 32000, (batch, 128), generator=gen).tolist()
            steps: dict[str, list[float]] = {name: [] for name in runners}
            prefills: dict[str, list[float]] = {name: [] for name in runners}
            same = True
            for _ in range(args.rounds):
                tokens = {}
                for name, runner in runners.items():
                    measured = greedy_round(runner, prompts, args.steps)
                    tokens[name] = measured.tokens
                    steps[name].append(1000 * statistics.median(measured.step_s))
                    prefills[name].append(1000 * measured.prefill_s)
                same = same and tokens["eager"] == tokens["compiled"]
            ratio = statistics.median(steps["compiled"]) / statistics.median(steps["eager"])
            pre_ratio = statistics.median(prefills["compiled"]) / statistics.median(prefills["eager"])
            cells = "; ".join(
                f"{name}: step {' '.join(f'{s:.1f}' for s in steps[name])} ms, "
                f"prefill {' '.join(f'{p:.0f}' for p in prefills[name])} ms"
                for name in runners
            )
            print(
                f"{dtype_name} batch {batch}: {cells}; compiled/eager step {ratio:.2f}x, prefill {pre_ratio:.2f}x; "
                f"same greedy tokens: {'yes' if same else 'no'}"
            )
        fallbacks = runners["compiled"].compiled.fallbacks if runners["compiled"].compiled else 0
        print(f"{dtype_name}: steps the graph would have recompiled for (run eagerly): {fallbacks}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
