"""The decode attention kernel against an earlier version of itself, and against the machine's read bandwidth.

One layer's decode attention for B sequences (default 64) with contexts of 100-300 tokens in scattered blocks of 16,
12 layers of pools, timed as the runtime calls it (`DecodeKernel.attend`, torch's threads). Two shapes: the random
Llama of runner_decode.py (12 KV heads, one query head each) and SmolLM2's grouping (3 KV heads of 3 query heads),
both head size 64. The kernel of this checkout and the one at `--against` (a git revision; its C source is built
the same way into a temporary folder) run in alternating rounds (A B A B), and each prints its median and min-max
over the rounds; the ratio is the earlier median over this one's (above 1: this checkout is faster). Both
results are compared first: float32 within 1e-5, bfloat16 within 2e-2 (the probabilities are rounded to bfloat16).
The read floor is torch summing the same number of K and V bytes on the same threads.

    .venv/bin/python benchmarks/decode_kernel_bench.py [--against HEAD~1] [--dtypes float32 bfloat16]
        [--batch 64] [--rounds 10] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from servegate.runtime.model import decode_kernel
from servegate.runtime.model.decode_kernel import DecodeKernel, load_decode_kernel

REPO = Path(__file__).resolve().parent.parent
LAYERS = 12
SHAPES = {"12 KV heads x 1": (12, 1), "3 KV heads x 3": (3, 3)}
"""(KV heads, query heads per KV head) of each case; head size 64."""


def kernel_at(revision: str, folder: Path) -> DecodeKernel:
    """The kernel as its C source was at `revision`, built with this checkout's compiler and flags."""
    relative = "servegate/runtime/model/kernels/decode_attention.c"  # in git, wherever servegate is installed
    source = folder / "decode_attention.c"
    shown = subprocess.run(["git", "show", f"{revision}:{relative}"], cwd=REPO, capture_output=True, text=True)
    if shown.returncode != 0:
        sys.exit(f"cannot read {relative} at {revision}: {shown.stderr.strip()}")
    source.write_text(shown.stdout)
    library = folder / "decode_attention.so"
    decode_kernel._build(decode_kernel._compiler(), library, source)  # the runtime's own compile command
    return DecodeKernel(decode_kernel._open(library), library)


def case(batch: int, kv_heads: int, groups: int, dtype: torch.dtype, seed: int = 0) -> tuple:
    """Queries, 12 layers of pools, block tables (blocks shuffled through the pool), lengths and first positions."""
    gen = torch.Generator().manual_seed(seed)
    dim, block = 64, 16
    lengths = torch.randint(100, 300, (batch,), generator=gen)
    counts = (lengths + block - 1) // block
    blocks = int(counts.sum())
    order = torch.randperm(blocks, generator=gen)
    table = torch.zeros(batch, int(counts.max()), dtype=torch.long)
    used = 0
    for b, n in enumerate(counts.tolist()):
        table[b, :n] = order[used : used + n]
        used += n
    pools = [
        tuple(torch.randn(kv_heads, blocks * block, dim, generator=gen).to(dtype) for _ in range(2))
        for _ in range(LAYERS)
    ]
    q = torch.randn(batch, kv_heads, groups, dim, generator=gen).to(dtype)
    return q, pools, table, lengths, torch.zeros_like(lengths), block


def run(kernel: DecodeKernel, pools: list[tuple[torch.Tensor, torch.Tensor]], inputs: tuple) -> list[torch.Tensor]:
    """Every layer's decode attention through `kernel` (inputs: q, table, lengths, first, block size)."""
    q, table, lengths, first, block = inputs
    return [kernel.attend(q, k, v, table, lengths, first, block, 0.125, None) for k, v in pools]


def read_rate(x: torch.Tensor, rounds: int = 8) -> float:
    """GB/s torch reaches summing `x` (median of `rounds`)."""
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - began)
    return x.numel() * x.element_size() / statistics.median(times) / 1e9


def read_floor(nbytes: int, dtype: torch.dtype, rounds: int = 8) -> float:
    """GB/s torch reaches summing `nbytes` of `dtype` (the fewest bytes any attention must read)."""
    return read_rate(torch.ones(nbytes // dtype.itemsize, dtype=dtype), rounds)


def main() -> None:
    """Build both kernels, check they agree, time them alternately per shape and dtype, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", default="HEAD~1", help="the git revision whose kernel to compare with")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        kernels = {"this checkout": load_decode_kernel(), args.against: kernel_at(args.against, Path(folder))}
        print(f"batch {args.batch}, {LAYERS} layers, contexts 100-300 tokens, head size 64, {args.threads} threads")
        print(f"{'dtype':<9} {'shape':<16} {'kernel':<14} {'median ms':>9} {'min-max ms':>13} {'GB/s':>6}")
        for name in args.dtypes:
            dtype = getattr(torch, name)
            for shape, (kv_heads, groups) in SHAPES.items():
                q, pools, table, lengths, first, block = case(args.batch, kv_heads, groups, dtype)
                nbytes = sum(k.numel() * k.element_size() * int(lengths.sum()) // k.shape[1] * 2 for k, _ in pools)
                inputs = (q, table, lengths, first, block)
                ours, theirs = (run(kernel, pools[:1], inputs)[0].double() for kernel in kernels.values())
                tolerance = 1e-5 if dtype == torch.float32 else 2e-2
                torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance)
                times: dict[str, list[float]] = {label: [] for label in kernels}
                for _ in range(args.rounds):
                    for label, kernel in kernels.items():
                        began = time.perf_counter()
                        run(kernel, pools, inputs)
                        times[label].append(1000 * (time.perf_counter() - began))
                for label, ms in times.items():
                    rate = nbytes / statistics.median(ms) / 1e6
                    spread = f"{min(ms):.1f}-{max(ms):.1f}"
                    print(f"{name:<9} {shape:<16} {label:<14} {statistics.median(ms):>9.1f} {spread:>13} {rate:>6.1f}")
                ratio = statistics.median(times[args.against]) / statistics.median(times["this checkout"])
                floor = read_floor(nbytes, dtype)
                print(f"{'':<26} {args.against} / this checkout: {ratio:.2f}x; read floor {floor:.1f} GB/s")
        with open("/proc/loadavg") as f:
            print(f"load average after: {' '.join(f.read().split()[:3])}")


if __name__ == "__main__":
    main()
