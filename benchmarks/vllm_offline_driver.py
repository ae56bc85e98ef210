"""vLLM's offline engine, driven over stdin/stdout by benchmarks/vllm_throughput.py (run with vLLM's interpreter).

It imports nothing from servegate (vLLM lives in its own venv). The first stdin line is the engine's
configuration as JSON ({"model", "dtype", "max_model_len", "max_num_seqs",
"max_num_batched_tokens", "seed", "enforce_eager", "prefix_caching"}); the engine is built
once. Each further line is one workload, {"jobs": [[prompt token ids, output tokens], ...]}, answered
by one stdout line starting with RESULT_PREFIX: {"wall_s", "e2e_s": [per job], "output_tokens"}. An empty
line or end of input stops it. vLLM's own logging goes wherever its stdout/stderr go; only lines with
the prefix are answers.

    VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_KVCACHE_SPACE=2 <vllm venv>/bin/python benchmarks/vllm_offline_driver.py
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

RESULT_PREFIX = "@@vllm-driver "
"""Start of every answer line (the rest of stdout is vLLM's log)."""


def answer(payload: dict[str, Any]) -> None:
    """One answer line on stdout."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(payload) + "\n")
    sys.stdout.flush()


def build_engine(config: dict[str, Any]) -> Any:
    """vLLM's LLM on the saved model, token-id prompts only (no tokenizer loaded)."""
    from vllm import LLM

    kwargs: dict[str, Any] = {
        "model": config["model"],
        "dtype": config["dtype"],
        "max_model_len": config["max_model_len"],
        "seed": config.get("seed", 0),
        "skip_tokenizer_init": True,
        "disable_log_stats": False,  # keeps each request's timestamps (RequestOutput.metrics)
    }
    if config.get("max_num_seqs"):
        kwargs["max_num_seqs"] = config["max_num_seqs"]
    if config.get("max_num_batched_tokens"):
        kwargs["max_num_batched_tokens"] = config["max_num_batched_tokens"]
    # servegate's engine has no prefix cache by default, and the rounds repeat the same prompts
    kwargs["enable_prefix_caching"] = bool(config.get("prefix_caching", False))
    if config.get("enforce_eager"):
        kwargs["enforce_eager"] = True
    return LLM(**kwargs)


def run_jobs(llm: Any, jobs: list[list[Any]]) -> dict[str, Any]:
    """All jobs submitted at once through LLM.generate; wall time and each job's finish time (engine clock)."""
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": list(prompt)} for prompt, _ in jobs]
    params = [SamplingParams(max_tokens=int(n), ignore_eos=True, detokenize=False, temperature=0.0) for _, n in jobs]
    start_mono = time.monotonic()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    e2e: list[float | None] = []
    produced = 0
    for out, (_, n) in zip(outputs, jobs, strict=True):
        tokens = len(out.outputs[0].token_ids)
        if tokens != int(n):
            raise RuntimeError(f"request {out.request_id} produced {tokens} tokens, asked for {n}")
        produced += tokens
        stats = getattr(out, "metrics", None)
        last = getattr(stats, "last_token_ts", 0.0) if stats is not None else 0.0
        # the engine core stamps tokens with time.monotonic() (system-wide on Linux, so it compares with ours)
        e2e.append(last - start_mono if last else None)
    return {"wall_s": wall, "e2e_s": e2e, "output_tokens": produced}


def main() -> None:
    """Build the engine from the first line, then answer one line per workload."""
    config = json.loads(sys.stdin.readline())
    began = time.perf_counter()
    llm = build_engine(config)
    import vllm

    answer({"ready": True, "startup_s": time.perf_counter() - began, "vllm": vllm.__version__})
    for line in sys.stdin:
        if not line.strip():
            break
        request = json.loads(line)
        try:
            answer(run_jobs(llm, request["jobs"]))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which stops the benchmark
            answer({"error": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    main()
