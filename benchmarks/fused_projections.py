"""Sibling projections as one oneDNN product (fused_linear.py) against one product per linear, side by side.

Two copies of one random model, both with `runtime.cpu_linear: onednn` routing: one with q/k/v and gate/up fused
(what the runtime does), one with every linear packed on its own (`route_linears_onednn(fuse_projections=False)`).
Each copy gets a paged runner with the decode attention kernel, as `runtime.decode_attention: auto` on CPU. For
each batch size, the same prompts are prefilled and decoded greedily on both, rounds alternating (A B A B); the
median decode step of each round is kept, and a prefill of --prefill-tokens tokens (one chunk per sequence) is timed
the same way. The two copies' logits are compared at every step: fusing must not change a bit.

    .venv/bin/python benchmarks/fused_projections.py [--model llama134|smollm2] [--dtypes float32 bfloat16]
        [--batches 1 8 32 64] [--rounds 3] [--steps 16] [--threads 2]

`llama134` is the 134M random Llama of the other runtime benchmarks (12 layers, hidden 768, 12 heads);
`smollm2` a random model of SmolLM2-135M's shape (30 layers, hidden 576, GQA 9/3 heads, intermediate 1536).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from runner_decode import build_model, greedy_round  # noqa: E402

from servegate.runtime.model.decode_kernel import load_decode_kernel  # noqa: E402
from servegate.runtime.model.fused_linear import route_linears_onednn  # noqa: E402
from servegate.runtime.model.model_runner import PagedModelRunner  # noqa: E402


def smollm2_shaped(dtype: torch.dtype) -> LlamaForCausalLM:
    """A random Llama of SmolLM2-135M's shape (its weights are not needed for timing)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).to(dtype).eval()


def spread(values: list[float]) -> str:
    """Median (min-max) in milliseconds."""
    ms = [1000 * v for v in values]
    return f"{statistics.median(ms):.1f} ({min(ms):.1f}-{max(ms):.1f})"


def main() -> None:
    """Print, per dtype and batch size, both designs' median decode step and prefill, and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama134", choices=["llama134", "smollm2"])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per design (alternating)")
    parser.add_argument("--steps", type=int, default=16, help="decode steps per round")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per sequence")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernel = load_decode_kernel()
    print(f"model {args.model}, {args.threads} torch threads, {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}")
    print(f"{'dtype':<9} {'batch':>5} {'design':<9} {'decode step ms':>22} {'prefill ms':>26}  step ratio  bitwise")
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        base = build_model(dtype) if args.model == "llama134" else smollm2_shaped(dtype)
        runners = {}
        for name, fused in (("separate", False), ("fused", True)):
            model = copy.deepcopy(base)
            route_linears_onednn(model, fuse_projections=fused)
            blocks = max(args.batches) * -(-(args.prompt + args.steps + 1) // 16)
            runners[name] = PagedModelRunner(model, num_blocks=blocks, block_size=16, decode_kernel=kernel)
        del base
        gen = torch.Generator().manual_seed(1)
        for batch in args.batches:
            prompts = torch.randint(10, 32000, (batch, args.prompt), generator=gen).tolist()
            steps: dict[str, list[float]] = {name: [] for name in runners}
            prefills: dict[str, list[float]] = {name: [] for name in runners}
            same = True
            for runner in runners.values():  # warm-up
                greedy_round(runner, prompts, 2)
            for _ in range(args.rounds):
                outputs = {}
                for name, runner in runners.items():
                    measured = greedy_round(runner, prompts, args.steps, keep_logits=True)
                    outputs[name] = measured.logits
                    steps[name].append(statistics.median(measured.step_s))
                    prefills[name].append(measured.prefill_s)
                same = same and all(torch.equal(a, b) for a, b in zip(*outputs.values(), strict=True))
            ratio = statistics.median(steps["fused"]) / statistics.median(steps["separate"])
            for name in runners:
                print(
                    f"{dtype_name:<9} {batch:>5} {name:<9} {spread(steps[name]):>22} {spread(prefills[name]):>26}"
                    + (f"  {ratio:9.2f}x  {'yes' if same else 'NO'}" if name == "fused" else "")
                )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
