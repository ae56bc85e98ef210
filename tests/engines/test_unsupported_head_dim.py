"""A model vLLM's CPU build cannot run fails at readiness with vLLM's own reason, not as a dead engine later.

zoo:tiny-fallback has head_dim 16, which vLLM's CPU attention lacks. Its server starts and answers
/health with 200; only a real completion shows that the engine cannot run the model. The manifest asks
for `runtime.backend: vllm`, as a user would. (This file sorts before the test_vllm_* files, so it runs
before the session's tiny-primary server starts.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from engines_support import READY_TIMEOUT_S

from servegate.contracts.errors import RemoteUnavailable
from servegate.contracts.manifest import ServedModel
from servegate.runtime import build

pytestmark = pytest.mark.engines


def test_a_head_dim_vllm_cannot_run_fails_readiness_with_the_engines_reason(vllm_python: Path, tmp_path: Path) -> None:
    served = ServedModel.model_validate(
        {
            "name": "tiny-fallback",
            "weights": {"source": "zoo:tiny-fallback"},
            "runtime": {
                "backend": "vllm",
                "device": "cpu",
                "dtype": "float32",
                "max_model_len": 128,
                "kv_cache": {"block_size": 32, "memory_budget": "64MiB"},
                "vllm": {"python": str(vllm_python), "log_dir": str(tmp_path), "startup_timeout_s": READY_TIMEOUT_S},
            },
            "batching": {"mode": "continuous", "max_num_batched_tokens": 256},
            "preprocess": {"max_input_tokens": 64},
            "postprocess": {"max_output_tokens": 32},
        }
    )
    engine = build(served)
    started = time.monotonic()
    with pytest.raises(RemoteUnavailable) as failure:
        engine.start_sync()  # type: ignore[attr-defined]
    elapsed = time.monotonic() - started
    message = str(failure.value)
    print(f"\nfailed after {elapsed:.1f} s:\n{message}")
    assert "Unsupported CPU attention configuration: head_dim=16" in message
    assert str(tmp_path) in message  # the log's path is named
    assert elapsed < READY_TIMEOUT_S - 30, "it waited out the timeout instead of seeing the engine fail"
    time.sleep(1.0)
    leftover = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "vllm.entrypoints" in text and str(tmp_path) in text:
            leftover.append(text)
    assert not leftover, "the API server, engine core or worker is still running"
