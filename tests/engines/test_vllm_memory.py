"""servegate's memory model sizes vLLM's KV cache exactly: the same bytes per token, the same block count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servegate.runtime.model.kv_memory import num_kv_blocks
from servegate.runtime.remote.vllm_process import VllmServer
from servegate.zoo import zoo_model_path

pytestmark = pytest.mark.engines


def memory_only_plan(config: Path, block_size: int, workdir: Path) -> dict[str, object]:
    """`gate plan --model-config` for fp32 at 256 tokens of context, as JSON."""
    args = ["plan", "--model-config", str(config), "--memory-budget", "2GiB", "--context", "256"]
    args += ["--dtype", "float32", "--block-size", str(block_size), "--json", "-"]
    done = subprocess.run(
        [sys.executable, "-m", "servegate.cli", *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        env={**os.environ, "SERVEGATE_HOME": str(workdir)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    plan: dict[str, object] = json.loads(done.stdout)
    return plan


def test_the_memory_models_kv_bytes_per_token_match_the_kv_cache_vllm_reports(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    cache = vllm_server.cache_config()
    budget, block_size = int(cache["kv_cache_memory_bytes"]), int(cache["block_size"])
    vllm_tokens = int(cache["kv_cache_size_tokens"])
    assert budget == vllm_server.launch.kv_cache_gib * 2**30, cache
    assert vllm_server.kv_cache_tokens() == vllm_tokens, "the start-up log and /metrics disagree"

    plan = memory_only_plan(zoo_model_path("tiny-primary") / "config.json", block_size, tmp_path)
    per_token = int(plan["kv_bytes_per_token"])  # type: ignore[call-overload]
    print(f"\nvLLM: {vllm_tokens:,} KV tokens in {budget:,} B, block {block_size}; servegate: {per_token:,} B/token")
    assert budget // vllm_tokens == per_token  # what vLLM's figure implies per token
    blocks = num_kv_blocks(budget, block_size, per_token)
    assert blocks == int(cache["num_gpu_blocks"])  # vLLM names its CPU blocks this way too
    assert blocks * block_size == vllm_tokens
