"""Throughput and latency of servegate's reference engine against vLLM's CPU engine, side by side in one run.

The random Llama of benchmarks/runner_decode.py (hidden 768, 12 layers, vocab 32000: 134M parameters) is
saved once to a temporary folder (safetensors, with a character-level tokenizer of the model's vocab
size), and both systems run it on the same threads, in float32 and, with --dtypes, bfloat16:

    (1) offline: the 64-request workload of benchmarks/runtime_throughput.py (prompts 16-256 tokens,
        outputs 8-128, EOS ignored), all requests at once. servegate: its ReferenceEngine with continuous
        batching, built as runtime_throughput.py builds it. vLLM: `LLM.generate` with token-id prompts and
        `SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False)`, in a child process on vLLM's
        interpreter (benchmarks/vllm_offline_driver.py, fed each workload as JSON).
    (2) served: servegate's own server of a manifest over the saved folder, and vLLM's OpenAI api_server
        started by servegate's launcher, both benched with `gate bench`'s code at the same Poisson rates
        (default: 0.6x the slower system's offline requests/s), in the first of --dtypes.

Each mode alternates the systems (servegate, vLLM, servegate, vLLM, ...; --rounds rounds), prints every
run with the load average at its start, then medians with the min-max spread and the servegate/vLLM
ratios. vLLM gets VLLM_CPU_OMP_THREADS_BIND=0-(threads-1); servegate `runtime.threads`. vLLM compiles its
model (torch inductor) at start-up; servegate compiles its decode steps of --compile-batch-sizes sequences when
given (`runtime.compile: decode`), its other steps' linears as --cpu-linear says, offline and served alike.

    .venv/bin/python benchmarks/vllm_throughput.py [--rounds 3] [--threads 2] [--dtypes float32 bfloat16]
        [--cpu-linear onednn] [--compile-batch-sizes 1 2 4] [--rates R ...] [--modes offline served]
        [--vllm-python PATH]
    .venv/bin/python benchmarks/vllm_throughput.py --quick    # tiny model, 8 requests, 1 round: checks the script
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from runner_decode import build_model  # noqa: E402
from runtime_throughput import (  # noqa: E402
    KV_BUDGET_BYTES,
    Job,
    Outcome,
    on_passing_thread,
    run_servegate,
    servegate_engine,
    workload,
)
from vllm_offline_driver import RESULT_PREFIX  # noqa: E402
from vllm_served import ServedPair, ServedRun, ServedShape  # noqa: E402

from servegate.runtime.remote.vllm_process import find_vllm_python  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).with_name("vllm_offline_driver.py")
VLLM_MAX_MODEL_LEN = 512
"""vLLM's --max-model-len: the longest prompt (256) plus the longest output (128) fits."""
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = " abcdefghijklmnopqrstuvwxyz0123456789+-=.,:;!?()[]{}\"'ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def quick_model(dtype: torch.dtype) -> LlamaForCausalLM:
    """A tiny random Llama with head_dim 64 (vLLM's CPU attention has no head_dim 16 kernel)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).to(dtype).eval()


def bench_model(quick: bool, dtype: torch.dtype) -> LlamaForCausalLM:
    """runner_decode's model (or the quick one) with its output rows of the special ids zeroed: a random model
    often repeats one token, and a request whose every token is special streams no text, which the bench
    counts as failed; with those logits at 0 (others of both signs) greedy decoding never picks them."""
    model = quick_model(dtype) if quick else build_model(dtype)
    with torch.no_grad():
        model.lm_head.weight[: len(SPECIALS)] = 0
    return model


def save_tokenizer(folder: Path, vocab_size: int) -> None:
    """A character-level tokenizer with exactly `vocab_size` ids (ids past the characters decode as <tN>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    names = SPECIALS + list(dict.fromkeys(CHARS))
    names += [f"<t{i}>" for i in range(len(names), vocab_size)]
    tok = Tokenizer(models.WordLevel({name: i for i, name in enumerate(names)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.save_pretrained(str(folder))


def save_model_folder(model: LlamaForCausalLM, folder: Path) -> Path:
    """The model as safetensors (float32) with its tokenizer, the folder both systems load."""
    model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = 1, 2, 0
    model.float().save_pretrained(str(folder), safe_serialization=True)
    save_tokenizer(folder, model.config.vocab_size)
    return folder


class VllmOffline:
    """The driver child on vLLM's interpreter: started once per dtype, one workload per `run`."""

    def __init__(self, python: Path, model_dir: Path, dtype: str, args: argparse.Namespace, log: Path) -> None:
        threads = args.threads
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        env.update(
            VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}" if threads > 1 else "0",
            VLLM_CPU_KVCACHE_SPACE=str(max(1, round(KV_BUDGET_BYTES / 2**30))),
            VLLM_CACHE_ROOT=str(log.parent / "vllm-cache"),
            HF_HUB_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            PYTHONUNBUFFERED="1",
        )
        self.log = log
        self._log: IO[str] = log.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [str(python), str(DRIVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
            start_new_session=True,
        )
        config = {"model": str(model_dir), "dtype": dtype, "max_model_len": VLLM_MAX_MODEL_LEN}
        config.update(max_num_seqs=args.max_batch, max_num_batched_tokens=args.tokens_per_step, seed=0)
        self._send({**config, "enforce_eager": args.quick, "prefix_caching": False})
        self.ready = self._receive()

    def _send(self, payload: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(payload) + "\n")
        self.proc.stdin.flush()

    def _receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(RESULT_PREFIX):
                answer = json.loads(line[len(RESULT_PREFIX) :])
                if "error" in answer:
                    raise RuntimeError(f"vLLM driver: {answer['error']} (log: {self.log})")
                return answer
            self._log.write(line)
        raise RuntimeError(f"the vLLM driver exited with {self.proc.wait()}; its log: {self.log}")

    def run(self, jobs: list[Job]) -> tuple[float, list[float]]:
        """All jobs at once through LLM.generate; (wall_s, e2e per job)."""
        self._send({"jobs": [[job.prompt, job.output_len] for job in jobs]})
        answer = self._receive()
        wall = float(answer["wall_s"])
        return wall, [wall if e is None else float(e) for e in answer["e2e_s"]]

    def pause(self) -> None:
        """Freeze vLLM's processes (SIGSTOP): idle, its worker still polls, ~8% of 2 cores measured."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let vLLM's processes run again (SIGCONT)."""
        os.killpg(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        """End the driver (its engine-core process with it)."""
        self.resume()
        try:
            self._send({})
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self._log.close()


def spread(values: list[float]) -> str:
    """Median with the min-max range."""
    return f"{statistics.median(values):7.1f} ({min(values):.1f}-{max(values):.1f})"


def ratio_line(label: str, ours: list[float], theirs: list[float]) -> str:
    """servegate/vLLM: ratio of medians, and the range of the per-round ratios."""
    per_round = [a / b for a, b in zip(ours, theirs, strict=True)]
    return (
        f"{label}: servegate/vLLM {statistics.median(ours) / statistics.median(theirs):.2f}x "
        f"(per round {min(per_round):.2f}-{max(per_round):.2f}x)"
    )


def run_on(system: str, engine: Any, vllm: VllmOffline, jobs: list[Job]) -> tuple[float, list[float]]:
    """All jobs at once on servegate's engine (vLLM frozen meanwhile, see VllmOffline.pause) or on vLLM."""
    if system == "vllm":
        return vllm.run(jobs)
    vllm.pause()
    try:
        return run_servegate(engine, jobs)
    finally:
        vllm.resume()


def decode_steps(engine: Any, vllm: VllmOffline, vocab: int, batch: int, steps: int, repeats: int = 2) -> None:
    """Mean decode step at `batch` sequences of 128-token prompts, both systems, alternating: the time of `steps`
    more tokens each over the time of 1 (prefill and first token), divided by `steps`; prints each measurement,
    and the prefill (the time of 1 token each) beside it."""
    rng = torch.Generator().manual_seed(7)
    prompts = torch.randint(3, vocab, (batch, 128), generator=rng).tolist()
    times: dict[str, list[float]] = {"servegate": [], "vllm": []}
    prefills: dict[str, list[float]] = {"servegate": [], "vllm": []}
    for system in times:  # untimed: the first batch of this shape pays for allocations
        run_on(system, engine, vllm, [Job(i, [2, *p[1:]], 2, 0.0) for i, p in enumerate(prompts)])
    for r in range(repeats):
        for system in times:
            # fresh prompts per run (vLLM's prefix cache is off, but servegate's could be on in a variant)
            short = [Job(i, [r + 3, *p[1:]], 1, 0.0) for i, p in enumerate(prompts)]
            long = [Job(i, [r + 3, *p[1:]], steps + 1, 0.0) for i, p in enumerate(prompts)]
            first = run_on(system, engine, vllm, short)[0]
            prefills[system].append(1000 * first)
            times[system].append(1000 * (run_on(system, engine, vllm, long)[0] - first) / steps)
    for label, measured in ((f"decode step (mean of {steps} steps)", times), ("prefill (1 token each)", prefills)):
        ratio = statistics.median(measured["servegate"]) / statistics.median(measured["vllm"])
        print(
            f"  {label} at batch {batch}, 128-token prompts: "
            + "; ".join(f"{s} " + ", ".join(f"{ms:.0f}" for ms in t) + " ms" for s, t in measured.items())
            + f"; servegate/vLLM time {ratio:.2f}x",
            flush=True,
        )


def compiled_label(args: argparse.Namespace) -> str:
    """What servegate compiles, as the progress lines name it."""
    if args.compile_steps:
        return "every step of 2+ sequences (compile: steps)"
    return f"decode steps of {args.compile_batch_sizes} sequences" if args.compile_batch_sizes else "off"


def offline_mode(args: argparse.Namespace, dtype: str, model_dir: Path, logs: Path, vllm_python: Path) -> float:
    """Alternating offline rounds in one dtype; prints them and the medians; returns the slower requests/s."""
    torch_dtype = getattr(torch, dtype)
    model = on_passing_thread(lambda: bench_model(args.quick, torch_dtype))
    vocab = model.config.vocab_size
    shape = {"prompt": (4, 32), "out": (2, 16)} if args.quick else {"prompt": (16, 256), "out": (8, 128)}
    jobs = workload(args.requests, None, vocab, **shape)
    useful = sum(j.output_len for j in jobs)
    began = time.monotonic()
    engine = servegate_engine(
        model,
        "continuous",
        args.max_batch,
        KV_BUDGET_BYTES,
        args.tokens_per_step,
        args.threads,
        args.cpu_linear,
        args.compile_batch_sizes,
        decode_attention=args.decode_attention,
        compile_steps=args.compile_steps,
    )
    sg_start = time.monotonic() - began
    vllm = VllmOffline(vllm_python, model_dir, dtype, args, logs / f"vllm-offline-{dtype}.log")
    kernel = getattr(engine.parts.runner, "decode_kernel", None)
    print(
        f"offline {dtype}: servegate engine ready in {sg_start:.0f} s (decode attention: "
        f"{'kernel' if kernel is not None else 'sdpa'}; compiled: {compiled_label(args)}), "
        f"vLLM {vllm.ready['vllm']} LLM in "
        f"{vllm.ready['startup_s']:.0f} s; {len(jobs)} requests at once, {useful} output tokens",
        flush=True,
    )
    warm = workload(4, None, vocab, seed=99, prompt=(4, 8), out=(2, 4))
    run_servegate(engine, warm)
    vllm.run(warm)
    runs: dict[str, list[Outcome]] = {"servegate": [], "vllm": []}
    try:
        for r in range(args.rounds):
            for system in ("servegate", "vllm"):
                load = os.getloadavg()[0]
                wall, e2e = run_on(system, engine, vllm, jobs)
                outcome = Outcome(system, "all-at-once", useful, wall, e2e)
                runs[system].append(outcome)
                print(
                    f"  round {r + 1} {system:<9} {outcome.tokens_per_s:7.1f} output tokens/s | p50 "
                    f"{outcome.percentile(50):6.1f} s | p99 {outcome.percentile(99):6.1f} s | wall {wall:6.1f} s | "
                    f"load {load:.1f}",
                    flush=True,
                )
        decode_steps(engine, vllm, vocab, args.max_batch, 2 if args.quick else 32)
    finally:
        vllm.close()
        engine.shutdown_sync()
    for system, outs in runs.items():
        print(
            f"  {system:<9} median (min-max) over {len(outs)} rounds: {spread([o.tokens_per_s for o in outs])} "
            f"output tokens/s, p50 {spread([o.percentile(50) for o in outs])} s, "
            f"p99 {spread([o.percentile(99) for o in outs])} s",
            flush=True,
        )
    ours, theirs = ([o.tokens_per_s for o in runs[s]] for s in ("servegate", "vllm"))
    print("  " + ratio_line(f"offline {dtype} output tokens/s", ours, theirs), flush=True)
    return min(statistics.median(ours), statistics.median(theirs)) * len(jobs) / useful


def served_mode(
    args: argparse.Namespace, dtype: str, model_dir: Path, logs: Path, python: Path, rates: list[float]
) -> None:
    """Both servers up, benched alternately at each rate; prints every run, the medians and ratios."""
    shape = ServedShape(
        model_dir,
        dtype,
        args.threads,
        args.max_batch,
        args.tokens_per_step,
        KV_BUDGET_BYTES,
        VLLM_MAX_MODEL_LEN,
        (4, 32) if args.quick else (16, 256),
        (2, 16) if args.quick else (8, 128),
        args.cpu_linear,
        args.decode_attention,
        tuple(args.compile_batch_sizes),
        compile_steps=args.compile_steps,
    )
    pair = ServedPair(shape, python, logs, enforce_eager=args.quick)
    try:
        pair.start()
        print(
            f"served {dtype}: servegate server ready in {pair.startup['servegate']:.0f} s (compiled: "
            f"{compiled_label(args)}), vLLM api_server in "
            f"{pair.startup['vllm']:.0f} s; {args.served_requests} requests per run, Poisson",
            flush=True,
        )
        for system in ("servegate", "vllm"):  # one short warm-up run each
            pair.bench(system, rates[0], min(4, args.served_requests), seed=99)
        for rate in rates:
            runs: dict[str, list[ServedRun]] = {"servegate": [], "vllm": []}
            for r in range(args.served_rounds):
                for system in ("servegate", "vllm"):
                    run = pair.bench(system, rate, args.served_requests, seed=r)
                    runs[system].append(run)
                    print(
                        f"  {rate:.2f} req/s round {r + 1} {system:<9} {run.output_tokens_per_s:7.1f} output tokens/s"
                        f" | e2e p50 {run.e2e_p50_s:6.1f} s | p99 {run.e2e_p99_s:6.1f} s | TTFT p50 "
                        f"{run.ttft_p50_ms:7.0f} ms | TPOT p50 {run.tpot_p50_ms:6.1f} ms | failed {run.failed} | load "
                        f"{run.load:.1f}",
                        flush=True,
                    )
                    if run.errors:
                        print(f"    failed requests: {'; '.join(run.errors)[:500]}", flush=True)
            for system, outs in runs.items():
                print(
                    f"  {rate:.2f} req/s {system:<9} median (min-max): "
                    f"{spread([o.output_tokens_per_s for o in outs])} output tokens/s, e2e p50 "
                    f"{spread([o.e2e_p50_s for o in outs])} s, p99 {spread([o.e2e_p99_s for o in outs])} s, TPOT p50 "
                    f"{spread([o.tpot_p50_ms for o in outs])} ms",
                    flush=True,
                )
            for label, key in (
                ("output tokens/s", "output_tokens_per_s"),
                ("e2e p50", "e2e_p50_s"),
                ("TPOT p50", "tpot_p50_ms"),
            ):
                ours, theirs = ([getattr(o, key) for o in runs[s]] for s in ("servegate", "vllm"))
                print("  " + ratio_line(f"served {dtype} {rate:.2f} req/s {label}", ours, theirs), flush=True)
    finally:
        pair.close()


def machine_name() -> str:
    """lscpu's model name (the platform string when lscpu is absent)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")]
    return names[0] if names else platform.machine()


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per mode")
    parser.add_argument("--requests", type=int, default=None, help="requests per run (default 64; --quick 8)")
    parser.add_argument("--threads", type=int, default=2, help="threads for each system")
    parser.add_argument("--max-batch", type=int, default=32, help="servegate max_batch_size = vLLM --max-num-seqs")
    parser.add_argument(
        "--tokens-per-step", type=int, default=512, help="max_num_batched_tokens of both (chunked prefill)"
    )
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    parser.add_argument(
        "--cpu-linear",
        default="auto",
        choices=["auto", "torch", "openblas", "onednn"],
        help="servegate's runtime.cpu_linear, offline and served (vLLM packs its weights for oneDNN)",
    )
    parser.add_argument(
        "--decode-attention",
        default="auto",
        choices=["auto", "sdpa", "kernel"],
        help="servegate's runtime.decode_attention, offline and served (auto: the decode attention kernel on CPU)",
    )
    parser.add_argument(
        "--compile-batch-sizes",
        type=int,
        nargs="+",
        default=[],
        help="servegate's runtime.compile: decode for these batch sizes, offline and served (its other steps: "
        "--cpu-linear)",
    )
    parser.add_argument(
        "--compile-steps",
        action="store_true",
        help="servegate's runtime.compile: steps (one dynamic-shape graph for every step of 2+ sequences), offline "
        "and served; not with --compile-batch-sizes",
    )
    parser.add_argument("--modes", nargs="+", default=["offline", "served"], choices=["offline", "served"])
    parser.add_argument("--served-rounds", type=int, default=None, help="rounds per served rate (default --rounds)")
    parser.add_argument(
        "--served-requests", type=int, default=None, help="requests per served run (default --requests)"
    )
    parser.add_argument("--rates", type=float, nargs="+", default=None, help="served Poisson rates, requests/s")
    parser.add_argument("--vllm-python", type=Path, default=None, help="vLLM's interpreter (default: found)")
    parser.add_argument("--quick", action="store_true", help="tiny model, 8 requests, 1 round: checks the script")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1 if "--rounds" not in sys.argv else args.rounds
    args.requests = args.requests or (8 if args.quick else 64)
    args.served_requests = args.served_requests or args.requests
    args.served_rounds = args.served_rounds or args.rounds
    if args.compile_steps and args.compile_batch_sizes:
        parser.error("--compile-steps and --compile-batch-sizes are two compile modes: choose one")
    if "served" in args.modes and args.rates is None and "offline" not in args.modes:
        parser.error("served alone needs --rates (the default rate comes from the offline run)")
    return args


def main() -> None:
    """Save the model, run the offline and served modes, print everything."""
    args = parse_args()
    python = args.vllm_python or find_vllm_python(REPO)
    if python is None:
        sys.exit("no vLLM interpreter: set SERVEGATE_VLLM_PYTHON or run `make vllm-venv` (or pass --vllm-python)")
    torch.set_num_threads(args.threads)
    print(
        f"machine: {machine_name()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        f"{args.threads} threads per system; torch {torch.__version__}; vLLM interpreter {python}; "
        f"UTC {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="vllm-throughput-") as tmp:
        folder = Path(tmp) / "model"
        model = on_passing_thread(lambda: bench_model(args.quick, torch.float32))
        save_model_folder(model, folder)
        params_m = sum(p.numel() for p in model.parameters()) / 1e6
        del model
        print(f"model: random Llama, {params_m:.0f}M parameters, saved to {folder}", flush=True)
        logs = Path(tempfile.mkdtemp(prefix="vllm-throughput-logs-"))
        print(f"logs (both engines, kept): {logs}", flush=True)
        req_rates = (
            [offline_mode(args, d, folder, logs, python) for d in args.dtypes] if "offline" in args.modes else []
        )
        if "served" in args.modes:
            rates = args.rates or [round(0.6 * req_rates[0], 2)]
            served_mode(args, args.dtypes[0], folder, logs, python, rates)
    print(f"done at UTC {time.strftime('%H:%M', time.gmtime())}, load average {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
