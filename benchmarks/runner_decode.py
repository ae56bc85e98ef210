"""Decode speed of PagedModelRunner vs transformers' own decode loop (DynamicCache), side by side.

A random Llama (hidden 768, 12 layers, vocab 32000, untied head: 134M parameters, 110M of them read
per decode step) in float32. For each batch size, B equal-length prompts are prefilled and then
decoded greedily, once through the paged runner (one `execute` per step) and once through the loop
`generate` runs (forward + DynamicCache). Only decode steps are timed, one by one, alternating the two
paths; the median step is reported. The batch-1 figure is also compared with the memory-bandwidth
roofline: weight bytes read per step divided by the measured copy bandwidth of this machine (ten copies
at the start and ten after each timed batch-1 run; the roofline at their median and at their best).

    .venv/bin/python benchmarks/runner_decode.py [--batches 1 8 16 32] [--steps 32] [--prompt 128]
        [--cpu-linear torch|openblas|onednn] [--compile-batch-sizes 1 8 ...]
        [--decode-attention per-sequence|batched|kernel|compare]

`--decode-attention` picks how the runner's decode steps attend: `per-sequence` (the default here: one SDPA call per
sequence per layer, `runtime.decode_attention: sdpa`), `batched` (one SDPA call per layer over a padded gather,
`PagedModelRunner(batched_decode=True)`), `kernel` (the decode attention kernel, one call per layer reading the
blocks in place: `runtime.decode_attention: auto` on CPU). `compare` skips transformers and times the three designs
against each other on one runner, rounds alternating (A B C A B C, --repeats rounds of each), and counts the SDPA
calls of a step.

With `--cpu-linear openblas` the runner's own copy of the model has its linears routed through
OpenBLAS as `runtime.cpu_linear` does (torch on 1 thread, the BLAS pool on --threads); transformers'
loop keeps stock torch linears on --threads torch threads. The roofline's copy bandwidth is measured
with --threads torch threads (the machine's cores by default), the same cores either path uses.
With `--cpu-linear onednn` the runner's copy has its linear weights packed for oneDNN (torch's threads, as
`runtime.cpu_linear: onednn`). With `--compile-batch-sizes` the runner's decode steps of those batch sizes run
the graph that `runtime.compile: decode` compiles (at start-up, before any timing), on --threads torch threads.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from servegate.runtime.model.cpu_linear import TORCH_DEFAULT_THREADS, route_linears, set_blas_threads
from servegate.runtime.model.decode_kernel import load_decode_kernel
from servegate.runtime.model.fused_linear import route_linears_onednn
from servegate.runtime.model.model_runner import PagedModelRunner
from servegate.runtime.types import SeqChunk


def build_model(dtype: torch.dtype) -> LlamaForCausalLM:
    """The ~110M-parameter random Llama of the runtime benchmarks."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).to(dtype).eval()


def copy_bandwidths(nbytes: int = 256 * 2**20, repeats: int = 10) -> list[float]:
    """Memory copy bandwidth of each of `repeats` copies of `nbytes`, in bytes/s (read + write counted once each)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        rates.append(2 * nbytes / (time.perf_counter() - t0))
    return rates


def copy_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 10) -> float:
    """The best of `repeats` measured copy bandwidths, in bytes/s."""
    return max(copy_bandwidths(nbytes, repeats))


def weight_bytes_per_step(model: LlamaForCausalLM) -> int:
    """Bytes of weights one decode step reads (all parameters except the input embedding table)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    return total - emb.numel() * emb.element_size()


@dataclass
class GreedyRound:
    """One prefill of equal-length prompts in one step, then greedy decode steps of all of them together."""

    prefill_s: float
    step_s: list[float]
    """Seconds of each decode step."""
    logits: list[torch.Tensor]
    """The logits of the prefill and of each step ([batch, vocab] each), or empty unless asked to keep them."""
    tokens: list[list[int]]
    """The greedy token of every sequence at the prefill and at each step."""


def greedy_round(
    runner: PagedModelRunner,
    prompts: list[list[int]],
    steps: int,
    *,
    fragmented: bool = False,
    keep_logits: bool = False,
) -> GreedyRound:
    """Prefill all prompts in one `execute`, then `steps` greedy decode steps, each timed on its own.

    Each sequence owns consecutive blocks, or with `fragmented` every B-th block (no two consecutive)."""
    bs, batch = runner.block_size, len(prompts)
    need = (len(prompts[0]) + steps + 1 + bs - 1) // bs
    if fragmented:
        tables = [tuple(range(i, need * batch, batch)) for i in range(batch)]
    else:
        tables = [tuple(range(i * need, (i + 1) * need)) for i in range(batch)]
    began = time.perf_counter()
    logits = runner.execute([SeqChunk(i, tuple(p), 0, tables[i]) for i, p in enumerate(prompts)])
    last = logits.argmax(-1).tolist()
    out = GreedyRound(time.perf_counter() - began, [], [logits] if keep_logits else [], [last])
    pos = len(prompts[0])
    for _ in range(steps):
        began = time.perf_counter()
        logits = runner.execute([SeqChunk(i, (last[i],), pos, tables[i]) for i in range(batch)])
        last = logits.argmax(-1).tolist()
        out.step_s.append(time.perf_counter() - began)
        out.tokens.append(last)
        if keep_logits:
            out.logits.append(logits)
        pos += 1
    return out


def runner_decode(
    runner: PagedModelRunner, prompts: list[list[int]], steps: int, fragmented: bool = False
) -> list[float]:
    """Seconds of each greedy decode step after one prefill of all prompts (steps - 1 steps)."""
    return greedy_round(runner, prompts, steps - 1, fragmented=fragmented).step_s


def hf_decode(model: LlamaForCausalLM, prompts: list[list[int]], steps: int) -> list[float]:
    """Seconds of each step of transformers' own greedy loop (forward + DynamicCache, as generate runs it)."""
    ids = torch.tensor(prompts)
    times = []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        for _ in range(steps - 1):
            t0 = time.perf_counter()
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            out = model(input_ids=nxt, cache=cache, use_cache=True, logits_to_keep=1)
            out.logits[:, -1].argmax(-1).tolist()
            times.append(time.perf_counter() - t0)
    return times


def attention_calls(runner: PagedModelRunner, prompts: list[list[int]]) -> int:
    """SDPA calls in one decode step of the runner after a prefill of `prompts` (consecutive blocks)."""
    runner_decode(runner, prompts, 1)
    need = (len(prompts[0]) + 1 + runner.block_size - 1) // runner.block_size
    chunks = [SeqChunk(i, (5,), len(p), tuple(range(i * need, (i + 1) * need))) for i, p in enumerate(prompts)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.execute(chunks)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::scaled_dot_product_attention")


def compare_decode_attention(runner: PagedModelRunner, args: argparse.Namespace) -> None:
    """The decode attention designs on one runner: median step per round, rounds alternating (A B C A B C ...)."""
    gen = torch.Generator().manual_seed(1)
    kernel = load_decode_kernel()
    # (batched_decode, decode_kernel) of each design
    designs = {"kernel": (False, kernel), "batched": (True, None), "per-sequence": (False, None)}
    print(f"{'batch':>5} {'design':<13} {'calls/step':>10} {'median ms':>9} {'min-max ms':>14}  per-round medians (ms)")
    for batch in args.batches:
        prompts = torch.randint(10, 32000, (batch, args.prompt), generator=gen).tolist()
        steps: dict[str, list[float]] = {name: [] for name in designs}
        rounds: dict[str, list[float]] = {name: [] for name in designs}
        calls = {}
        for name, (batched, with_kernel) in designs.items():  # warm-up, and the SDPA call count
            runner.batched_decode, runner.decode_kernel = batched, with_kernel
            runner_decode(runner, prompts, 4, args.fragmented)
            calls[name] = "1/layer" if with_kernel else str(attention_calls(runner, prompts))
        for _ in range(args.repeats):
            for name, (batched, with_kernel) in designs.items():
                runner.batched_decode, runner.decode_kernel = batched, with_kernel
                times = runner_decode(runner, prompts, args.steps, args.fragmented)
                steps[name] += times
                rounds[name].append(1000 * statistics.median(times))
        for name in designs:
            ms = [1000 * t for t in steps[name]]
            per_round = " ".join(f"{r:.1f}" for r in rounds[name])
            print(
                f"{batch:>5} {name:<13} {calls[name]:>10} {statistics.median(ms):>9.1f} "
                f"{f'{min(ms):.1f}-{max(ms):.1f}':>14}  {per_round}"
            )
        base = statistics.median(steps["per-sequence"])
        ratios = ", ".join(f"{name} {base / statistics.median(steps[name]):.2f}x" for name in designs)
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
        print(f"      per-sequence step / each design's (above 1: faster): {ratios}; load average after: {load}")


def main() -> None:
    """Print decode tokens/s per batch size for both paths and the batch-1 roofline ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 32])
    parser.add_argument("--steps", type=int, default=32, help="decode tokens per sequence")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per sequence")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per path (median step reported)")
    parser.add_argument("--fragmented", action="store_true", help="no two blocks of a sequence consecutive")
    parser.add_argument(
        "--cpu-linear", default="torch", choices=["torch", "openblas", "onednn"], help="the runner's linears"
    )
    parser.add_argument(
        "--compile-batch-sizes",
        type=int,
        nargs="+",
        default=None,
        help="compile the runner's decode steps of these batch sizes (runtime.compile: decode; linears stay torch's)",
    )
    parser.add_argument(
        "--decode-attention",
        default="per-sequence",
        choices=["per-sequence", "batched", "kernel", "compare"],
        help="the runner's decode attention (compare: the three designs against each other, no transformers)",
    )
    args = parser.parse_args()
    threads = args.threads or TORCH_DEFAULT_THREADS
    torch.set_num_threads(threads)
    dtype = getattr(torch, args.dtype)
    model = build_model(dtype)
    ours_model = model
    if args.compile_batch_sizes and args.cpu_linear != "torch":
        parser.error("--compile-batch-sizes runs the products in inductor's kernels: leave --cpu-linear torch")
    if args.compile_batch_sizes:
        ours_model = copy.deepcopy(model)  # the paged runner switches its attention; transformers keeps sdpa
    if args.cpu_linear == "onednn":
        ours_model = copy.deepcopy(model)
        route_linears_onednn(ours_model)
    if args.cpu_linear == "openblas":
        ours_model = copy.deepcopy(model)
        route_linears(ours_model)
        set_blas_threads(threads)
    # torch threads for each path: routed, torch keeps one thread and the BLAS pool has the cores
    ours_threads = 1 if args.cpu_linear == "openblas" else threads
    params = sum(p.numel() for p in model.parameters())
    copies = copy_bandwidths()  # more after each timed batch-1 run: the VM's bandwidth moves minute to minute
    step_bytes = weight_bytes_per_step(model)
    print(
        f"model: random Llama, {params / 1e6:.1f}M parameters, {args.dtype}, {threads} threads; "
        f"servegate linears: {args.cpu_linear}, compiled decode: {args.compile_batch_sizes or 'off'}"
    )
    print(
        f"copy bandwidth at start: median {statistics.median(copies) / 1e9:.1f} GB/s, best {max(copies) / 1e9:.1f} "
        f"GB/s; weights read per step {step_bytes / 1e6:.0f} MB"
    )
    max_batch = max(args.batches)
    blocks = max_batch * ((args.prompt + args.steps + args.block_size - 1) // args.block_size)
    runner = PagedModelRunner(
        ours_model,
        num_blocks=blocks,
        block_size=args.block_size,
        compile_batch_sizes=args.compile_batch_sizes or (),
        batched_decode=args.decode_attention == "batched",
        decode_kernel=load_decode_kernel() if args.decode_attention == "kernel" else None,
    )
    if args.decode_attention == "compare":
        torch.set_num_threads(ours_threads)
        compare_decode_attention(runner, args)
        return
    gen = torch.Generator().manual_seed(1)
    columns = f"{'batch':>5} {'servegate tok/s':>16} {'HF tok/s':>9} {'ratio':>6}"
    print(f"{columns} {'servegate ms/step':>18} {'HF ms/step':>11}")
    for batch in args.batches:
        prompts = torch.randint(10, 32000, (batch, args.prompt), generator=gen).tolist()
        ours: list[float] = []
        theirs: list[float] = []
        for repeat in range(args.repeats + 1):  # alternate the two so load changes hit both alike
            torch.set_num_threads(ours_threads)
            times = runner_decode(runner, prompts, args.steps if repeat else 4, args.fragmented)
            ours += times if repeat else []  # the first round warms up
            if batch == 1 and repeat:
                copies += copy_bandwidths()
            torch.set_num_threads(threads)
            times = hf_decode(model, prompts, args.steps if repeat else 4)
            theirs += times if repeat else []
        # the median step: robust to other processes taking the CPU now and then
        ours_ms, theirs_ms = 1000 * statistics.median(ours), 1000 * statistics.median(theirs)
        ours_tps, theirs_tps = 1000 * batch / ours_ms, 1000 * batch / theirs_ms
        print(
            f"{batch:>5} {ours_tps:>16.1f} {theirs_tps:>9.1f} {ours_tps / theirs_tps:>6.2f} "
            f"{ours_ms:>18.1f} {theirs_ms:>11.1f}"
        )
        if batch == 1:
            # the decode figure is a median step: the roofline at the median copy, and at the best as well
            for label, bandwidth in (("median", statistics.median(copies)), ("best", max(copies))):
                roofline = bandwidth / step_bytes
                print(
                    f"      batch-1 roofline at the {label} copy ({bandwidth / 1e9:.1f} GB/s): {roofline:.1f} "
                    f"tokens/s; decode = {ours_tps / roofline:.0%} of it (HF: {theirs_tps / roofline:.0%})"
                )


if __name__ == "__main__":
    main()
