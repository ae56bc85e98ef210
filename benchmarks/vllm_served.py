"""The served half of benchmarks/vllm_throughput.py: servegate's server and vLLM's, benched by `gate bench`'s code.

servegate's server is the manifest's own (`LocalServer`: `create_app` on uvicorn in a child process,
what `gate serve` and `gate bench MANIFEST` run) over the saved model folder; vLLM's is its OpenAI
api_server started by servegate's launcher (`VllmLaunch`/`VllmServer`, readiness on a real completion).
Both are measured with `bench_url`, the function behind `gate bench --url ... --tokenizer ...`:
the same open-loop Poisson arrivals, prompt and output lengths (EOS ignored), prompts cut to exact
token counts with the model folder's tokenizer.
"""

from __future__ import annotations

import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime_throughput import bench_manifest  # benchmarks/ is on sys.path, as vllm_throughput.py puts it

from servegate.capacity.bench.local_server import LocalServer
from servegate.capacity.bench.own_server import bench_url, load_tokenizer
from servegate.contracts.capacity_section import LengthDistribution, Workload
from servegate.contracts.manifest import ServedModel
from servegate.runtime.remote.server_process import free_port
from servegate.runtime.remote.vllm_process import VllmLaunch, VllmServer

SERVED_NAME = "bench"
"""The model name both servers answer to."""


@dataclass(frozen=True)
class ServedShape:
    """What both servers are configured with, and the requests they get."""

    model_dir: Path
    dtype: str
    threads: int
    max_batch: int
    tokens_per_step: int
    kv_budget_bytes: int
    max_model_len: int
    prompt: tuple[int, int]
    out: tuple[int, int]
    cpu_linear: str = "auto"
    """servegate's `runtime.cpu_linear` (the offline mode's `--cpu-linear`)."""
    decode_attention: str = "auto"
    """servegate's `runtime.decode_attention` (the offline mode's `--decode-attention`)."""
    compile_batch_sizes: tuple[int, ...] = ()
    """servegate's `runtime.compile: decode` batch sizes (empty: compile off)."""
    compile_steps: bool = False
    """servegate's `runtime.compile: steps` (then `compile_batch_sizes` is not read)."""


@dataclass
class ServedRun:
    """One bench run against one server."""

    system: str
    rate_rps: float
    output_tokens_per_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    ttft_p50_ms: float
    tpot_p50_ms: float
    """Median time per output token after the first (issue 38's served target: servegate's <= vLLM's)."""
    failed: int
    load: float
    errors: list[str]
    """The distinct errors of the failed requests (a request that streamed no text counts as failed)."""


def servegate_manifest(shape: ServedShape) -> ServedModel:
    """A manifest serving the saved folder as runtime_throughput.py's engine is configured (continuous batching)."""
    return bench_manifest(
        str(shape.model_dir),
        dtype=shape.dtype,
        threads=shape.threads,
        cpu_linear=shape.cpu_linear,
        decode_attention=shape.decode_attention,
        compile_batch_sizes=shape.compile_batch_sizes,
        kv_budget_bytes=shape.kv_budget_bytes,
        mode="continuous",
        max_batch=shape.max_batch,
        tokens_per_step=shape.tokens_per_step,
        name=SERVED_NAME,
        compile_steps=shape.compile_steps,
    )


def bench_workload(shape: ServedShape, rate: float, requests: int) -> Workload:
    """Poisson arrivals at `rate`, uniform prompt and output lengths over the offline workload's ranges."""

    def uniform(bounds: tuple[int, int]) -> LengthDistribution:
        lo, hi = bounds
        return LengthDistribution(distribution="uniform", mean=(lo + hi) // 2, min=lo, max=hi)

    return Workload(
        arrival="poisson",
        rate_rps=rate,
        num_requests=requests,
        input_tokens=uniform(shape.prompt),
        output_tokens=uniform(shape.out),
    )


class ServedPair:
    """Both servers up at once (started one after the other), each benched on demand; `close()` stops both."""

    def __init__(self, shape: ServedShape, vllm_python: Path, log_dir: Path, enforce_eager: bool = False) -> None:
        self.shape = shape
        self.tokenizer = load_tokenizer(shape.model_dir)
        self.servegate = LocalServer(servegate_manifest(shape), log_path=log_dir / "servegate-server.log")
        launch = VllmLaunch(
            python=vllm_python,
            model=shape.model_dir,
            served_model_name=SERVED_NAME,
            port=free_port(),
            cache_root=Path(tempfile.mkdtemp(prefix="vllm-cache-", dir=log_dir)),
            dtype=shape.dtype,
            max_model_len=shape.max_model_len,
            kv_cache_gib=max(1, round(shape.kv_budget_bytes / 2**30)),
            cpu_threads_bind=f"0-{shape.threads - 1}" if shape.threads > 1 else "0",
            max_num_seqs=shape.max_batch,
            # the same scheduler limits as servegate's manifest, and no prefix cache (servegate's default)
            extra_args=(
                "--max-num-batched-tokens",
                str(shape.tokens_per_step),
                "--no-enable-prefix-caching",
                *(["--enforce-eager"] if enforce_eager else []),
            ),
        )
        self.vllm = VllmServer(launch, log_dir / "vllm-server.log")
        self.startup: dict[str, float] = {}

    def start(self) -> None:
        """Start servegate's server, then vLLM's (each ready on a real request before the next starts)."""
        import time

        began = time.monotonic()
        self.servegate.start()
        self.startup["servegate"] = time.monotonic() - began
        self.vllm.start()
        self.vllm.wait_ready(prompt="ab 12", max_tokens=4, timeout_s=900.0)
        self.startup["vllm"] = self.vllm.ready_after_s or 0.0

    def bench(self, system: str, rate: float, requests: int, seed: int) -> ServedRun:
        """One bench run of `requests` requests at `rate` against `system` ("servegate" or "vllm")."""
        url = self.servegate.url if system == "servegate" else self.vllm.launch.base_url + "/v1"
        load = os.getloadavg()[0]
        group = self.vllm.process.pid if self.vllm.process is not None else None
        freeze = system == "servegate" and group is not None
        if freeze:  # idle, vLLM's worker still polls (~8% of 2 cores measured): frozen while servegate runs
            os.killpg(group, signal.SIGSTOP)
        try:
            workload = bench_workload(self.shape, rate, requests)
            result = bench_url(url, workload, model_name=SERVED_NAME, tokenizer=self.tokenizer, seed=seed)
        finally:
            if freeze:
                os.killpg(group, signal.SIGCONT)
        report: dict[str, Any] = result.as_dict()
        e2e = report["e2el_ms"]
        return ServedRun(
            system,
            rate,
            float(report["throughput"]["output_tokens_per_s"]),
            e2e["p50"] / 1000,
            e2e["p99"] / 1000,
            float(report["ttft_ms"]["p50"]),
            float(report["tpot_ms"]["p50"]),
            int(report["requests"]["failed"]),
            load,
            sorted({r.error or "no text streamed" for run in result.runs for r in run.records if not r.ok}),
        )

    def close(self) -> None:
        """Stop both servers (vLLM's whole process group)."""
        try:
            self.vllm.stop()
        finally:
            self.servegate.stop()
