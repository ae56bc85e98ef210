"""The decode attention kernel over KV pools on 4 KiB pages against the same pools on 2 MiB pages.

The runtime places the CPU KV pools of a cache of 512 MiB or more on 2 MiB pages (runtime/model/huge_pages.py): a decode
step reads every sequence's blocks where they lie, a few KiB per block and head, so on 4 KiB pages nearly every block
costs a TLB miss, and a page walk on a virtual machine is two-dimensional. This script takes decode_kernel_bench.py's
cases (batch 64, 12 layers of pools, contexts of 100-300 tokens in shuffled blocks of 16, head size 64; the random
Llama's 12 KV heads x 1 and SmolLM2's 3 x 3), copies each pool once into torch.zeros (4 KiB pages) and once into
huge_page_zeros, checks both give the same bits, and times one call per layer over all 12 layers, alternating (4 KiB, 2
MiB, ...). It prints each side's median and min-max, the ratio, and torch's read rate over one large tensor of either
kind, with the machine's transparent-huge-page mode and how much of the pools it backed.

Then whole decode steps: the random 134M Llama of runner_decode.py, linears packed for oneDNN, the decode attention
kernel, two PagedModelRunners on the same model, one with its pools made by torch.zeros and one as the runtime
makes them. Each sequence's blocks are scattered (no two consecutive), 128-token prompts are prefilled and 32
greedy steps decoded, rounds alternating; it prints the median step of each round, the ratio of the medians and
whether both chose the same tokens.

    .venv/bin/python benchmarks/kv_huge_pages.py [--dtypes float32 bfloat16] [--rounds 10] [--threads 2]
        [--step-batches 64] [--step-rounds 4]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_kernel_bench import SHAPES, case, read_rate, run  # noqa: E402
from runner_decode import build_model, greedy_round  # noqa: E402

from servegate.runtime.model import paged_attention  # noqa: E402
from servegate.runtime.model.decode_kernel import load_decode_kernel  # noqa: E402
from servegate.runtime.model.fused_linear import route_linears_onednn  # noqa: E402
from servegate.runtime.model.huge_pages import huge_page_zeros  # noqa: E402
from servegate.runtime.model.model_runner import PagedModelRunner  # noqa: E402

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_kib() -> int:
    """KiB of this process's anonymous memory on huge pages (/proc/self/smaps_rollup)."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


@contextlib.contextmanager
def pools_on(huge: bool):
    """PagedKVCache makes its pools on 2 MiB pages (`huge`) or with torch.zeros (4 KiB pages) inside this block,
    whatever the cache's size."""
    placed = paged_attention._pool
    paged_attention._pool = lambda shape, dtype, device, _: placed(shape, dtype, device, huge)
    try:
        yield
    finally:
        paged_attention._pool = placed


def compare_steps(dtype: torch.dtype, batch: int, rounds: int) -> None:
    """Median decode step of two runners on one model, pools on 4 KiB and on 2 MiB pages, rounds alternating."""
    model = build_model(dtype)
    route_linears_onednn(model)
    blocks = 2 * batch * -(-(128 + 32 + 1) // 16)
    with pools_on(huge=False):
        small = PagedModelRunner(model, num_blocks=blocks, block_size=16, decode_kernel=load_decode_kernel())
    with pools_on(huge=True):
        large = PagedModelRunner(model, num_blocks=blocks, block_size=16, decode_kernel=load_decode_kernel())
    prompts = torch.randint(10, 32000, (batch, 128), generator=torch.Generator().manual_seed(1)).tolist()
    steps: dict[str, list[float]] = {"4 KiB": [], "2 MiB": []}
    tokens = {}
    with torch.inference_mode():
        for index in range(rounds + 1):  # the first round warms up
            for label, runner in (("4 KiB", small), ("2 MiB", large)):
                done = greedy_round(runner, prompts, 32, fragmented=True)
                steps[label] += [1000 * statistics.median(done.step_s)] if index else []
                tokens[label] = done.tokens
    for label, ms in steps.items():
        rounds_ms = ", ".join(f"{x:.1f}" for x in ms)
        print(f"{dtype!s:<15} batch {batch:<3} {label:<6} decode step {statistics.median(ms):.1f} ms ({rounds_ms})")
    ratio = statistics.median(steps["4 KiB"]) / statistics.median(steps["2 MiB"])
    print(f"{'':<25} 4 KiB / 2 MiB: {ratio:.2f}x; same greedy tokens: {tokens['4 KiB'] == tokens['2 MiB']}")


def main() -> None:
    """Build the pools both ways, check the kernel agrees on them, time them alternately, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--step-batches", type=int, nargs="*", default=[64], help="decode-step batches (none: skip)")
    parser.add_argument("--step-rounds", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernel = load_decode_kernel()
    mode = THP.read_text().strip() if THP.exists() else "absent"
    print(f"batch 64, 12 layers, contexts 100-300 tokens, head size 64, {args.threads} threads; THP: {mode}")
    print(f"{'dtype':<9} {'shape':<16} {'pages':<6} {'median ms':>9} {'min-max ms':>12}")
    for name in args.dtypes:
        dtype = getattr(torch, name)
        for shape, (kv_heads, groups) in SHAPES.items():
            q, pools, table, lengths, first, block = case(64, kv_heads, groups, dtype)
            before = huge_kib()
            small = [tuple(torch.zeros(t.shape, dtype=dtype).copy_(t) for t in pair) for pair in pools]
            large = [tuple(huge_page_zeros(tuple(t.shape), dtype).copy_(t) for t in pair) for pair in pools]
            backed = (huge_kib() - before) / (sum(t.numel() * t.element_size() for p in pools for t in p) / 1024)
            del pools
            inputs = (q, table, lengths, first, block)
            for ours, theirs in zip(run(kernel, small, inputs), run(kernel, large, inputs), strict=True):
                assert torch.equal(ours, theirs), "the kernel read different bits from the same pools"
            times: dict[str, list[float]] = {"4 KiB": [], "2 MiB": []}
            for _ in range(args.rounds):
                for label, layers in (("4 KiB", small), ("2 MiB", large)):
                    began = time.perf_counter()
                    run(kernel, layers, inputs)
                    times[label].append(1000 * (time.perf_counter() - began))
            for label, ms in times.items():
                spread = f"{min(ms):.1f}-{max(ms):.1f}"
                print(f"{name:<9} {shape:<16} {label:<6} {statistics.median(ms):>9.1f} {spread:>12}")
            ratio = statistics.median(times["4 KiB"]) / statistics.median(times["2 MiB"])
            print(f"{'':<26} 4 KiB / 2 MiB: {ratio:.2f}x; {100 * backed:.0f}% of the 2 MiB pools on huge pages")
    size = (64 * 2**20,)  # float32: 256 MiB
    flat = torch.ones(size), huge_page_zeros(size, torch.float32).fill_(1)
    print(f"torch sum over 256 MiB: {read_rate(flat[0]):.1f} GB/s on 4 KiB pages, {read_rate(flat[1]):.1f} on 2 MiB")
    del flat
    for name in args.dtypes:
        for batch in args.step_batches:
            compare_steps(getattr(torch, name), batch, args.step_rounds)
    with open("/proc/loadavg") as f:
        print(f"load average after: {' '.join(f.read().split()[:3])}")


if __name__ == "__main__":
    main()
