"""Throughput and latency of servegate's continuous batching vs transformers, side by side.

Workload: N requests (default 64) with prompts of 16-256 tokens and outputs of 8-128 tokens (exact
lengths: EOS ignored), on the random Llama of benchmarks/runner_decode.py (hidden 768, 12 layers, vocab
32000: 134M parameters) in float32 on CPU. Two arrival patterns: all at once, and Poisson at --rate requests/s
(default: half the request rate servegate reached all at once, so every system sees the same moderate load).

    (a) transformers `generate` in padded static batches of 16 (a batch starts when the previous one
        ends, with up to 16 requests that have arrived; it runs to its longest output)
    (b) transformers' own continuous batching (the manager behind `model.generate_batch`, fed each
        request at its arrival time with its own max_new_tokens)
    (c) servegate's reference engine, batching.mode=continuous

For each: useful output tokens/s (the tokens the requests asked for; padding excluded), and p50/p99
end-to-end latency (arrival to last token). Ratios (c)/(a) and (c)/(b) are printed, and the batch-1
decode speed of the engine against the memory-bandwidth roofline.

    .venv/bin/python benchmarks/runtime_throughput.py [--requests 64] [--rate R] [--max-batch 32] [--threads 1]
        [--cpu-linear auto|torch|openblas|onednn] [--compile-batch-sizes 1 ...] [--patterns [all-at-once poisson]]
    .venv/bin/python benchmarks/runtime_throughput.py --quick     # a tiny model, to check the script runs
    python3 benchmarks/runtime_throughput.py --device cuda [--dtype bfloat16] [--json out.json]

On CUDA (`--device cuda`, see cuda_throughput.py) the model is a random 1.1B Llama (TinyLlama's shape) in
bfloat16, and batch-1 decode is set against the HBM roofline: weight bytes per token at 4.3 TB/s (and at the
copy rate measured on that GPU). `--json` writes every figure of the run to a file.

Every system gets --threads cores (default: torch's default, the physical cores): (a) and (b) as torch
threads; (c) as its manifest's `runtime.threads`, which with `runtime.cpu_linear` routed to OpenBLAS
means the BLAS pool has them and torch keeps one. The roofline's copy bandwidth is measured on the same
number of threads, in a child process, with ten copies just before and ten just after each batch-1 run
(--solo-runs of them): the roofline at their median and at their best are both printed.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import multiprocessing
import os
import platform
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from cuda_throughput import build_llama_1b, gpu_copy_bandwidth, roofline_lines, write_json  # noqa: E402
from runner_decode import build_model, copy_bandwidths, weight_bytes_per_step  # noqa: E402
from transformers_systems import KV_BUDGET_BYTES, Job, run_static_generate, run_transformers_cb  # noqa: E402,E501

from servegate.contracts.manifest import ServedModel  # noqa: E402
from servegate.runtime.engine.reference import ReferenceEngine  # noqa: E402
from servegate.runtime.model.cpu_linear import TORCH_DEFAULT_THREADS  # noqa: E402
from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams


@dataclass
class Outcome:
    """What one system achieved on one arrival pattern."""

    system: str
    pattern: str
    useful_tokens: int
    wall_s: float
    e2e_s: list[float]

    @property
    def tokens_per_s(self) -> float:
        """Useful output tokens per second."""
        return self.useful_tokens / self.wall_s

    def percentile(self, q: float) -> float:
        """End-to-end latency percentile in seconds."""
        ordered = sorted(self.e2e_s)
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def workload(n: int, rate: float | None, vocab: int, seed: int = 0, prompt=(16, 256), out=(8, 128)) -> list[Job]:
    """N jobs; arrival 0 for all (rate None) or Poisson at `rate` requests/s."""
    rng = random.Random(seed)
    t = 0.0
    jobs = []
    for i in range(n):
        if rate is not None and i > 0:
            t += rng.expovariate(rate)
        prompt_ids = [rng.randrange(3, vocab) for _ in range(rng.randint(*prompt))]
        jobs.append(Job(i, prompt_ids, rng.randint(*out), t if rate is not None else 0.0))
    return jobs


# --- (c) servegate -------------------------------------------------------------------------------


class IdsOnly:
    """Prompt ids as given (the workload is pre-tokenized) and a decode that only counts tokens."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        """The model's vocabulary: the engine refuses a request built in code with an id past it."""

    def encode(self, request: GenerationRequest) -> Any:
        """The request's token ids."""
        from types import SimpleNamespace

        return SimpleNamespace(token_ids=list(request.prompt_token_ids or []), truncated_tokens=0)

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        """One character per token (text is not what this benchmark measures)."""
        return "x" * len(ids)


def bench_manifest(
    source: str,
    *,
    dtype: str,
    threads: int,
    cpu_linear: str,
    decode_attention: str,
    compile_batch_sizes: list[int] | tuple[int, ...] | None,
    kv_budget_bytes: int,
    mode: str,
    max_batch: int,
    tokens_per_step: int,
    device: str = "cpu",
    name: str = "bench",
    compile_steps: bool = False,
) -> ServedModel:
    """The manifest every servegate side of these benchmarks runs (offline engine and served server alike): the
    runtime and batching as given, prompts and outputs up to 512 tokens, no deadline and an unbounded queue.
    `compile_steps`: `runtime.compile: steps`; else `compile_batch_sizes` empty or None: compile off."""
    return ServedModel.model_validate(
        {
            "name": name,
            "weights": {"source": source},
            "preprocess": {"max_input_tokens": 512},
            "postprocess": {"max_output_tokens": 512},
            "runtime": {
                "max_model_len": 1024,
                "device": device,
                "dtype": dtype,
                "threads": threads,
                "cpu_linear": cpu_linear,
                "decode_attention": decode_attention,
                "compile": "steps" if compile_steps else "decode" if compile_batch_sizes else "off",
                "compile_batch_sizes": list(compile_batch_sizes or [1]),
                "kv_cache": {"block_size": 16, "memory_budget": kv_budget_bytes},
            },
            "batching": {
                "mode": mode,
                "max_batch_size": max_batch,
                "max_num_batched_tokens": tokens_per_step,
                "chunked_prefill": mode == "continuous",
            },
            "failure_policy": {"request_timeout_s": 86_400, "max_queue": 100_000},
        }
    )


def servegate_engine(
    model: Any,
    mode: str,
    max_batch: int,
    budget_bytes: int,
    tokens_per_step: int,
    threads: int,
    cpu_linear: str,
    compile_batch_sizes: list[int] | None = None,
    device: str = "cpu",
    decode_attention: str = "auto",
    compile_steps: bool = False,
) -> ReferenceEngine:
    """A reference engine over a paged runner of `model`, configured as a manifest would (linears routed as it
    says, decode steps of `compile_batch_sizes` sequences compiled as `runtime.compile: decode` does, or with
    `compile_steps` every step of two or more sequences as `runtime.compile: steps` does)."""
    served = bench_manifest(
        "zoo:tiny-primary",
        dtype=str(model.dtype).removeprefix("torch."),
        threads=threads,
        cpu_linear=cpu_linear,
        decode_attention=decode_attention,
        compile_batch_sizes=compile_batch_sizes,
        kv_budget_bytes=budget_bytes,
        mode=mode,
        max_batch=max_batch,
        tokens_per_step=tokens_per_step,
        device=device,
        compile_steps=compile_steps,
    )
    # given the model, the engine builds its runner as for a loaded one (cpu_linear, KV pool, compiled decode),
    # on its own loop thread like every engine
    try:
        from servegate.runtime.model.sampling import sample_batch as sampler
    except ImportError:  # part of the runtime still being written: greedy is all this benchmark needs

        def sampler(logits: torch.Tensor, params: list[Any], generators: list[Any]) -> tuple[Any, Any]:
            return logits.argmax(-1), torch.zeros(len(params))

    ids = IdsOnly(model.config.vocab_size)
    engine = ReferenceEngine(served, model=model, tokenizer=ids, preprocessor=ids, sampler=sampler)
    engine.start_sync()
    return engine


def run_servegate(engine: ReferenceEngine, jobs: list[Job]) -> tuple[float, list[float]]:
    """Submit each job at its arrival time; returns (wall_s, e2e per job)."""
    e2e = [0.0] * len(jobs)

    async def one(job: Job, start: float) -> None:
        await asyncio.sleep(max(0.0, start + job.arrival_s - time.perf_counter()))
        params = SamplingParams(max_tokens=job.output_len, ignore_eos=True)
        request = GenerationRequest(f"job-{job.index}", prompt_token_ids=job.prompt, params=params)
        async for event in engine.submit(request):
            if isinstance(event, FinishEvent):
                assert event.usage.completion_tokens == job.output_len
            elif not hasattr(event, "token_ids"):
                raise RuntimeError(f"job {job.index} failed: {event}")
        e2e[job.index] = time.perf_counter() - start - job.arrival_s

    async def all_jobs() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(one(job, start) for job in jobs))
        return time.perf_counter() - start

    return asyncio.run(all_jobs()), e2e


def batch1_decode_tokens_per_s(engine: ReferenceEngine, tokens: int = 64) -> float:
    """Output tokens/s of one request decoding alone through the whole engine (prefill of 16 excluded)."""
    request = GenerationRequest(
        "solo", prompt_token_ids=list(range(3, 19)), params=SamplingParams(max_tokens=tokens, ignore_eos=True)
    )

    async def go() -> tuple[float, float]:
        first = last = 0.0
        async for _event in engine.submit(request):
            now = time.perf_counter()
            first = first or now
            last = now
        return first, last

    first, last = asyncio.run(go())
    return (tokens - 1) / (last - first)


def on_passing_thread(make: Any, threads: int | None = None) -> Any:
    """make() on a thread that then exits (on `threads` torch threads when given). Torch's OpenMP keeps a
    worker pool for each thread that ran a parallel op, and with a second pool beside the engine thread's,
    libgomp on 2 cores stops spinning its workers between ops (see ReferenceEngine.start_sync); the pool of
    a thread that exits goes with it, so the engine's batch-1 runs have no idle pool beside them."""
    made: list[Any] = []

    def run() -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        made.append(make())

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return made[0]


def copy_bandwidths_with_threads(threads: int) -> list[float]:
    """copy_bandwidths on `threads` torch threads (run in a child process)."""
    torch.set_num_threads(threads)
    return copy_bandwidths()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="Poisson arrival rate, requests/s (default: half of servegate's all-at-once requests/s)",
    )
    parser.add_argument("--max-batch", type=int, default=32, help="servegate max_batch_size")
    parser.add_argument("--tokens-per-step", type=int, default=512, help="max_num_batched_tokens (b and c)")
    parser.add_argument(
        "--patterns", nargs="*", default=["all-at-once", "poisson"], help="none: only the batch-1 decode figure"
    )
    parser.add_argument("--threads", type=int, default=None, help="threads for every system (default: torch's)")
    parser.add_argument(
        "--cpu-linear", default="auto", choices=["auto", "torch", "openblas", "onednn"], help="(c)'s linears"
    )
    parser.add_argument(
        "--compile-batch-sizes",
        type=int,
        nargs="+",
        default=None,
        help="(c) with runtime.compile: decode for these numbers of sequences (its linears then stay torch's)",
    )
    parser.add_argument("--solo-runs", type=int, default=5, help="batch-1 decode measurements, each with its roofline")
    parser.add_argument("--quick", action="store_true", help="tiny model and workload: checks the script only")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: the 1.1B Llama on the GPU")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default: float32; cuda: bf16")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    dtype = getattr(torch, args.dtype)
    threads = args.threads or TORCH_DEFAULT_THREADS
    torch.set_num_threads(threads)

    if args.quick:
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=1024,
        )
        model = LlamaForCausalLM(cfg).to(device=args.device, dtype=dtype).eval()
        shape = {"prompt": (4, 32), "out": (2, 16)}
    elif args.device == "cuda":
        model = build_llama_1b(dtype)
        shape = {"prompt": (16, 256), "out": (8, 128)}
    else:
        model = on_passing_thread(lambda: build_model(torch.float32))
        shape = {"prompt": (16, 256), "out": (8, 128)}
    vocab = model.config.vocab_size
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {threads} threads per "
        f"system, load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}; (c) linears: {args.cpu_linear}, "
        f"compiled decode: {args.compile_batch_sizes or 'off'}"
    )
    print(
        f"model: random Llama, {params_m:.0f}M parameters, {args.dtype} on {args.device}; {args.requests} requests, "
        f"prompts "
        f"{shape['prompt'][0]}-{shape['prompt'][1]} tokens, outputs {shape['out'][0]}-{shape['out'][1]} tokens"
    )

    # the paged runner switches its model to servegate's attention: transformers runs on its own copy (sdpa)
    engine = servegate_engine(
        on_passing_thread(lambda: copy.deepcopy(model)),
        "continuous",
        args.max_batch,
        KV_BUDGET_BYTES,
        args.tokens_per_step,
        threads,
        args.cpu_linear,
        args.compile_batch_sizes,
        args.device,
    )
    warm = workload(4, None, vocab, seed=99, prompt=(4, 8), out=(2, 4))
    run_servegate(engine, warm)
    if args.patterns:  # (a) and (b) run on passing threads, each beside the (idle) engine thread's pool
        on_passing_thread(lambda: run_static_generate(model, warm), threads)

    outcomes: list[Outcome] = []
    batch1: dict[str, Any] = {}
    if args.device == "cuda":  # first (a few seconds): the GPU's HBM is what batch-1 decode streams from
        solos = [batch1_decode_tokens_per_s(engine) for _ in range(args.solo_runs)]
        lines, batch1 = roofline_lines(solos, weight_bytes_per_step(model), gpu_copy_bandwidth())
        print("\n".join(lines), flush=True)
    rate = args.rate
    for pattern in args.patterns:
        if pattern == "poisson" and rate is None:
            served = [o for o in outcomes if o.system.startswith("(c)")]
            rate = 0.5 * args.requests / served[0].wall_s if served else 0.5
        jobs = workload(args.requests, rate if pattern == "poisson" else None, vocab, **shape)
        useful = sum(j.output_len for j in jobs)
        label = pattern if pattern != "poisson" else f"poisson {rate:.3f} req/s"
        systems = {
            "(a) transformers generate, static batches of 16": lambda jobs=jobs: run_static_generate(model, jobs),
            "(b) transformers continuous batching": lambda jobs=jobs: run_transformers_cb(
                model, jobs, args.tokens_per_step, args.max_batch
            ),
            "(c) servegate continuous": lambda jobs=jobs: run_servegate(engine, jobs),
        }
        for system, runner in systems.items():
            load = os.getloadavg()[0]  # other work on the machine skews a run: printed beside each figure
            # (a), (b) on --threads torch threads; (c)'s engine thread set its own from the manifest
            try:
                wall, e2e = runner() if system.startswith("(c)") else on_passing_thread(runner, threads)
            except Exception as exc:  # e.g. a transformers without continuous batching: the others still run
                print(f"{label:>22} | {system:<48} | failed: {type(exc).__name__}: {exc}", flush=True)
                continue
            outcome = Outcome(system, label, useful, wall, e2e)
            outcomes.append(outcome)
            print(
                f"{label:>22} | {system:<48} | {outcome.tokens_per_s:7.1f} output tokens/s | "
                f"p50 {outcome.percentile(50):6.1f} s | p99 {outcome.percentile(99):6.1f} s | wall {wall:6.1f} s | "
                f"load {load:.1f}",
                flush=True,
            )
        ran = {o.system[:3]: o for o in outcomes if o.pattern == label}
        if len(ran) == 3:
            a, b, c = ran["(a)"], ran["(b)"], ran["(c)"]
            print(
                f"{label:>22} | ratios: (c)/(a) {c.tokens_per_s / a.tokens_per_s:.2f}x tokens/s, "
                f"(c)/(b) {c.tokens_per_s / b.tokens_per_s:.2f}x tokens/s; p99 (c) {c.percentile(99):.1f} s vs "
                f"(a) {a.percentile(99):.1f} s, (b) {b.percentile(99):.1f} s",
                flush=True,
            )
        if args.json is not None:  # after every pattern: a run cut short still leaves what it measured
            write_json(args.json, args, model, outcomes, batch1)

    if args.device == "cuda":
        engine.shutdown_sync()
        return
    # the copy bandwidth is measured in a child process: a parallel copy on this thread would give it an
    # OpenMP pool beside the engine thread's, and two pools on 2 cores slow the engine's steps (see
    # ReferenceEngine.start_sync)
    with multiprocessing.get_context("spawn").Pool(1) as child:
        child.apply(copy_bandwidths_with_threads, (threads,))  # the child's imports must not overlap a run
        step_bytes = weight_bytes_per_step(model)
        before = child.apply(copy_bandwidths_with_threads, (threads,))
        typical, best = [], []
        for _ in range(args.solo_runs):
            # the VM's bandwidth moves from minute to minute: each run against copies made just before and after
            # it, their median (the decode figure is a mean over its steps, not its best step) and their best
            solo = batch1_decode_tokens_per_s(engine)
            after = child.apply(copy_bandwidths_with_threads, (threads,))
            around = before + after
            roofline, best_roofline = statistics.median(around) / step_bytes, max(around) / step_bytes
            typical.append(solo / roofline)
            best.append(solo / best_roofline)
            print(
                f"batch-1 decode through the engine: {solo:.1f} tokens/s; roofline {roofline:.1f} tokens/s at the "
                f"median copy bandwidth around the run ({statistics.median(around) / 1e9:.1f} GB/s) -> "
                f"{typical[-1]:.0%}; {best_roofline:.1f} tokens/s at the best copy ({max(around) / 1e9:.1f} GB/s) "
                f"-> {best[-1]:.0%}",
                flush=True,
            )
            before = after
        if typical:
            print(
                f"batch-1 decode, median of {len(typical)} runs: {statistics.median(typical):.0%} of the roofline "
                f"at the median copy bandwidth, {statistics.median(best):.0%} at the best",
                flush=True,
            )
    if args.json is not None:
        write_json(args.json, args, model, outcomes, {"share_of_roofline_median": typical, "at_best_copy": best})
    engine.shutdown_sync()


if __name__ == "__main__":
    main()
