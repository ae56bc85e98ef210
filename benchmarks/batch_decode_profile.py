"""Where a batched decode step of servegate's PagedModelRunner spends its time, by torch operator.

The random Llama of runner_decode.py (134M parameters), B sequences (default 32) of 128-token prompts
prefilled, then --steps greedy decode steps under torch's profiler (CPU). Prints the step time without
the profiler (runner_decode.runner_decode, median step), then the operators by self time per step,
grouped: matrix products (aten::mm/addmm/bmm/matmul kernels), attention (scaled_dot_product and its
kernels, softmax), the KV gather (index_select of block tables), and the rest (norms, rotary, the KV write,
indexing, copies), with calls per step.

    .venv/bin/python benchmarks/batch_decode_profile.py [--batch 32] [--threads 2] [--steps 16] [--dtype float32]
        [--decode-attention per-sequence|batched]

`--decode-attention batched` profiles one attention call per layer for all decoding sequences
(`PagedModelRunner(batched_decode=True)`); the default is the runtime's own, one call per sequence per layer.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import torch
from runner_decode import build_model, runner_decode
from torch.profiler import ProfilerActivity, profile

from servegate.runtime.model.decode_kernel import KERNEL_EVENT, load_decode_kernel
from servegate.runtime.model.fused_linear import route_linears_onednn
from servegate.runtime.model.model_runner import PagedModelRunner
from servegate.runtime.types import SeqChunk

PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "mkldnn", "aten::_mkl_linear")
ATTENTION = ("scaled_dot_product", "flash_attention", "aten::_softmax", "aten::softmax", KERNEL_EVENT)


def category(name: str) -> str:
    """Which of products, attention, KV gather (index_select), rest an operator's self time counts in."""
    if any(name.startswith(p) for p in PRODUCTS):
        return "matrix products"
    if any(a in name for a in ATTENTION):
        return "attention"
    if name == "aten::index_select":
        return "KV gather"
    return "rest"


def profiled_steps(runner: PagedModelRunner, prompts: list[list[int]], steps: int) -> profile:
    """Prefill, then `steps` decode steps under the profiler (consecutive blocks per sequence)."""
    need = (len(prompts[0]) + steps + 1 + runner.block_size - 1) // runner.block_size
    tables = [tuple(range(i * need, (i + 1) * need)) for i in range(len(prompts))]
    last = runner.execute([SeqChunk(i, tuple(p), 0, tables[i]) for i, p in enumerate(prompts)]).argmax(-1).tolist()
    pos = len(prompts[0])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            chunks = [SeqChunk(i, (last[i],), pos, tables[i]) for i in range(len(prompts))]
            last = runner.execute(chunks).argmax(-1).tolist()
            pos += 1
    return prof


def main() -> None:
    """Print the unprofiled step time and the per-operator breakdown of profiled steps."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--top", type=int, default=14, help="operators listed")
    parser.add_argument("--decode-attention", default="per-sequence", choices=["per-sequence", "batched", "kernel"])
    parser.add_argument("--cpu-linear", default="torch", choices=["torch", "onednn"], help="the runner's linears")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build_model(getattr(torch, args.dtype))
    if args.cpu_linear == "onednn":
        route_linears_onednn(model)  # packed once, as runtime.cpu_linear: onednn does
    blocks = 2 * args.batch * ((128 + 2 * args.steps + 16) // 16 + 1)
    runner = PagedModelRunner(
        model,
        num_blocks=blocks,
        block_size=16,
        batched_decode=args.decode_attention == "batched",
        decode_kernel=load_decode_kernel() if args.decode_attention == "kernel" else None,
    )
    prompts = torch.randint(10, 32000, (args.batch, 128), generator=torch.Generator().manual_seed(1)).tolist()
    runner_decode(runner, prompts, 4)  # warm-up
    plain = statistics.median(runner_decode(runner, prompts, args.steps + 1))
    prof = profiled_steps(runner, prompts, args.steps)
    rows = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total_ms = sum(e.self_cpu_time_total for e in rows) / 1000 / args.steps
    print(
        f"batch {args.batch}, {args.dtype}, {args.threads} threads, {args.decode_attention} decode attention: "
        f"decode step {1000 * plain:.0f} ms without the "
        f"profiler (median of {args.steps}); profiled self time {total_ms:.0f} ms per step"
    )
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in rows:
        group = groups[category(e.key)]
        group[0] += e.self_cpu_time_total / 1000 / args.steps
        group[1] += e.count / args.steps
    for name, (ms, calls) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:<16} {ms:7.1f} ms per step ({ms / total_ms:.0%}), {calls:6.0f} calls per step")
    print(f"  top {args.top} operators by self time:")
    for e in sorted(rows, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(
            f"    {e.key:<44} {e.self_cpu_time_total / 1000 / args.steps:7.1f} ms per step, "
            f"{e.count / args.steps:5.0f} calls per step  [{category(e.key)}]"
        )


if __name__ == "__main__":
    main()
