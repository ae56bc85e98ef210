"""One graph with a dynamic token count for every step, against the eager oneDNN steps (a measurement for issue 38;
not a runtime mode yet).

`runtime.compile: decode` compiles one static graph per batch size, with inductor's C++ GEMM template: far faster
at 1-6 sequences, slower from 32 on (benchmarks/README.md). This script measures the other design: the paged
runner's whole forward compiled once by torch inductor with dynamic shapes, in its default mode with the weights
frozen (so its weight prepacking hands the linears to oneDNN/MKL packed kernels, as `cpu_linear: onednn` does
eagerly) and every small op between the products fused. Prefills and decode steps of any size run the same graph;
paged attention stays the opaque custom op of compiled_decode.py.

Two copies of the random 134M Llama: one routed through oneDNN (`cpu_linear: onednn`, fused projections, the
decode attention kernel), one compiled so. For each batch size the same 128-token prompts are prefilled in one step
and decoded greedily; rounds alternate (eager, compiled, ...), and the median decode step and the prefill of each
round are printed with whether both copies chose the same greedy tokens. A first step of a shape the graph was not
traced for compiles again (the prefill of the first round of batch 1 below): that time is printed, not hidden.

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
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from runner_decode import build_model  # noqa: E402

from servegate.runtime.model import compiled_decode  # noqa: E402
from servegate.runtime.model.decode_kernel import load_decode_kernel  # noqa: E402
from servegate.runtime.model.fused_linear import route_linears_onednn  # noqa: E402
from servegate.runtime.model.model_runner import PagedModelRunner  # noqa: E402
from servegate.runtime.types import SeqChunk  # noqa: E402


class DynamicSteps(compiled_decode.CompiledDecode):
    """The runner's forward compiled once with dynamic shapes (inductor's default mode, weights frozen): every
    step runs it, a new shape class compiles on first use."""

    def __init__(self, model: Any) -> None:
        self._forward = torch.compile(compiled_decode.compile_view(model), dynamic=True)
        self.batch_sizes = frozenset()
        self.runs: dict[int, int] = {}
        self.fallbacks = 0

    def wants(self, num_seqs: int, num_tokens: int) -> bool:
        """Every step."""
        return True

    def run(self, step: Any, **inputs: Any) -> Any:
        """The compiled forward of one step (compiling it first when its shape class is new)."""
        import torch._inductor.config as inductor_config

        compiled_decode._current.step = step
        try:
            with inductor_config.patch({"freezing": True}):
                return self._forward(**inputs)
        finally:
            compiled_decode._current.step = None


def one_round(runner: PagedModelRunner, prompts: list[list[int]], steps: int) -> tuple[float, float, list[list[int]]]:
    """Prefill all prompts in one step, then greedy decode steps: (prefill s, median step s, tokens per step)."""
    bs, batch = runner.block_size, len(prompts)
    need = (len(prompts[0]) + steps + bs - 1) // bs
    tables = [tuple(range(i * need, (i + 1) * need)) for i in range(batch)]
    began = time.perf_counter()
    last = runner.execute([SeqChunk(i, tuple(p), 0, tables[i]) for i, p in enumerate(prompts)]).argmax(-1).tolist()
    prefill = time.perf_counter() - began
    tokens, times, pos = [last], [], len(prompts[0])
    for _ in range(steps):
        began = time.perf_counter()
        last = runner.execute([SeqChunk(i, (last[i],), pos, tables[i]) for i in range(batch)]).argmax(-1).tolist()
        times.append(time.perf_counter() - began)
        tokens.append(last)
        pos += 1
    return prefill, statistics.median(times), tokens


def resident_mib() -> float:
    """The process's resident memory now, in MiB."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


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
            if name == "eager":
                route_linears_onednn(model)
            runner = PagedModelRunner(model, num_blocks=blocks, block_size=16, decode_kernel=kernel)
            if name == "compiled":
                runner.compiled = DynamicSteps(model)
                one_round(runner, [[5] * 16, [7] * 16], 2)  # trace the prefill and decode shape classes
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
                    prefill, step, tokens[name] = one_round(runner, prompts, args.steps)
                    steps[name].append(1000 * step)
                    prefills[name].append(1000 * prefill)
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
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
