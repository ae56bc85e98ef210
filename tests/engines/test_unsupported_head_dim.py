"""A model vLLM's CPU build cannot run fails at readiness with vLLM's own reason, not as a dead engine later.

zoo:tiny-fallback has head_dim 16, which vLLM's CPU attention lacks. Its server starts and answers
/health with 200; only a real completion shows that the engine cannot run the model. (This file sorts
before the test_vllm_* files, so it runs before the session's tiny-primary server starts.)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from engines_support import READY_PROMPT, READY_TIMEOUT_S, launch_for

from servegate.runtime.vllm_process import VllmLaunchError, VllmServer
from servegate.zoo import zoo_model_path

pytestmark = pytest.mark.engines


def test_a_head_dim_vllm_cannot_run_fails_readiness_with_the_engines_reason(vllm_python: Path, tmp_path: Path) -> None:
    launch = launch_for(vllm_python, zoo_model_path("tiny-fallback"), "tiny-fallback", tmp_path)
    server = VllmServer(launch, tmp_path / "vllm.log")
    server.start()
    assert server.process is not None
    group = server.process.pid
    started = time.monotonic()
    try:
        with pytest.raises(VllmLaunchError) as failure:
            server.wait_ready(READY_PROMPT, timeout_s=READY_TIMEOUT_S)
        elapsed = time.monotonic() - started
    finally:
        status = server.stop()
    message = str(failure.value)
    print(f"\nfailed after {elapsed:.1f} s (server exit status {status}):\n{message}")
    assert "Unsupported CPU attention configuration: head_dim=16" in message
    assert str(server.log_path) in message
    assert elapsed < READY_TIMEOUT_S - 30, "it waited out the timeout instead of seeing the engine fail"
    assert server.ready_after_s is None
    with pytest.raises(ProcessLookupError):  # the API server, engine core and worker are all gone
        os.killpg(group, 0)
    with pytest.raises(httpx.TransportError):
        httpx.get(launch.base_url + "/health", timeout=5.0)
