"""`runtime.compile: steps` with sibling products concatenated (inductor's `cpp.enable_concat_linear`) against
the same graph without, in one process.

q/k/v and the MLP's gate/up read the same input. Left apart, the compiled graph runs 7 products a Llama layer; joined
at freezing, 4, each with more output columns for the CPU's AMX or AVX-512 tiles. runtime/model/compiled_steps.py
joins them. This script builds two `compile: steps` runners of the random 134M Llama (benchmarks/runner_decode.py),
one with the option off and one with it on (the runtime's), then alternates them (off, on, on, off, ...): a prefill
step of 4 prompts of 128 tokens (512 tokens, the engine's default chunk), and a greedy decode at 64 sequences. It
prints each side's median (min-max), the median of the per-round ratios, and whether both chose the same greedy
tokens (bfloat16 sums in another order can flip a near tie of the random model; float32 should agree).

    .venv/bin/python benchmarks/concat_linear.py --dtypes bfloat16 float32 --rounds 8
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
from runner_decode import build_model, greedy_round  # noqa: E402

from servegate.runtime.model import compiled_steps  # noqa: E402
from servegate.runtime.model.decode_kernel import load_decode_kernel  # noqa: E402
from servegate.runtime.model.fused_linear import route_linears_onednn  # noqa: E402
from servegate.runtime.model.model_runner import PagedModelRunner, SeqChunk  # noqa: E402

SIDES = ("apart", "joined")
PROMPT = 128
DECODE_BATCH = 64


def build_runner(base: torch.nn.Module, joined: bool, blocks_per_seq: int) -> PagedModelRunner:
    """A `compile: steps` runner of a copy of `base`, its sibling products joined or not; eager steps via oneDNN."""
    runtime_options = compiled_steps.CompiledSteps.compile_options

    def options(self: compiled_steps.CompiledSteps) -> dict[str, Any]:
        return {**runtime_options(self), "cpp.enable_concat_linear": joined}

    model = copy.deepcopy(base)
    compiled_steps.CompiledSteps.compile_options = options  # type: ignore[method-assign]  # read while compiling
    try:
        runner = PagedModelRunner(
            model,
            num_blocks=DECODE_BATCH * blocks_per_seq,
            block_size=16,
            decode_kernel=load_decode_kernel(),
            compile_steps=True,
        )
    finally:
        compiled_steps.CompiledSteps.compile_options = runtime_options  # type: ignore[method-assign]
    route_linears_onednn(model)  # after the graph is built, as engine/parts.py routes
    return runner


def prefill_ms(runner: PagedModelRunner, prompts: list[list[int]], blocks_per_seq: int) -> tuple[float, list[int]]:
    """One step prefilling every prompt: its milliseconds and each sequence's greedy token."""
    chunks = [
        SeqChunk(i, tuple(p), 0, tuple(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)))
        for i, p in enumerate(prompts)
    ]
    began = time.perf_counter()
    logits = runner.execute(chunks)
    return (time.perf_counter() - began) * 1e3, logits.float().argmax(-1).tolist()


def spread(values: list[float]) -> str:
    """Median (min-max) with one decimal."""
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    """Per dtype: both graphs' prefill step and decode step, alternating, with the ratio joined/apart per round."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8, help="greedy decode steps per round at 64 sequences")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} CPUs, {args.threads} torch threads, load average {os.getloadavg()[0]:.2f}")
    blocks_per_seq = -(-(PROMPT + args.steps + 1) // 16)
    gen = torch.Generator().manual_seed(1)
    prefill_prompts = torch.randint(10, 32000, (4, PROMPT), generator=gen).tolist()
    decode_prompts = torch.randint(10, 32000, (DECODE_BATCH, PROMPT), generator=gen).tolist()
    for dtype_name in args.dtypes:
        base = build_model(getattr(torch, dtype_name))
        runners = {}
        for side in SIDES:
            began = time.perf_counter()
            runners[side] = build_runner(base, side == "joined", blocks_per_seq)
            print(f"{dtype_name} {side}: compiled in {time.perf_counter() - began:.0f} s", flush=True)
        prefills: dict[str, list[float]] = {side: [] for side in SIDES}
        decodes: dict[str, list[float]] = {side: [] for side in SIDES}
        tokens: dict[str, list[Any]] = {side: [] for side in SIDES}
        for round_ in range(args.rounds + 1):  # round 0 warms both up and is not counted
            order = SIDES if round_ % 2 == 0 else SIDES[::-1]
            for side in order:
                ms, first = prefill_ms(runners[side], prefill_prompts, blocks_per_seq)
                decoded = greedy_round(runners[side], decode_prompts, args.steps)
                if round_:
                    prefills[side].append(ms)
                    decodes[side].append(statistics.median(decoded.step_s) * 1e3)
                    tokens[side].append((first, decoded.tokens))
        for side in SIDES:
            print(
                f"{dtype_name} {side:6s} prefill {len(prefill_prompts)}x{PROMPT} {spread(prefills[side])} ms | "
                f"decode step at {DECODE_BATCH} {spread(decodes[side])} ms"
            )
        for name, timed in (("prefill", prefills), ("decode step", decodes)):
            ratios = [j / a for j, a in zip(timed["joined"], timed["apart"], strict=True)]
            print(
                f"{dtype_name} {name} joined/apart: {statistics.median(ratios):.3f}x per round "
                f"({min(ratios):.3f}-{max(ratios):.3f})"
            )
        print(f"{dtype_name} same greedy tokens: {tokens['apart'] == tokens['joined']}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
