"""`gate serve` for the real clients, and where their virtual environments are (`make clients-venvs` builds them).

A module of its own (not conftest.py) so test modules import it by a name no other test folder uses.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.manifests import merged_manifest

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".venvs"
GATE = Path(sys.executable).with_name("gate")
MODEL = "tiny"


def client_bin(venv: str, command: str) -> Path:
    """A client's command in its venv; the test is skipped, naming the make target, when it is not built."""
    path = VENVS / venv / "bin" / command
    if not path.exists():
        pytest.skip(f"{path} is missing: run `make clients-venvs` first")
    return path


def manifest(weights: str, **sections: Any) -> dict[str, Any]:
    """The served deployment: the zoo's tiny-primary on continuous batching, no tenants, logprobs offered."""
    data: dict[str, Any] = {
        "apiVersion": "servegate/v1",
        "kind": "ServedModel",
        "name": MODEL,
        "weights": {"source": weights},
        "preprocess": {"chat_template": "none", "max_input_tokens": 96},
        "runtime": {"max_model_len": 128, "threads": 1, "kv_cache": {"block_size": 16, "memory_budget": "4MiB"}},
        "batching": {"mode": "continuous", "max_batch_size": 8, "max_num_batched_tokens": 256},
        "postprocess": {"max_output_tokens": 32, "logprobs": True},
    }
    return merged_manifest(data, **sections)


class GateServe:
    """`gate serve` on 127.0.0.1 and a free port, its output in a log file; stopped with SIGTERM."""

    def __init__(self, folder: Path, data: dict[str, Any]) -> None:
        path = folder / "manifest.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = folder / "server.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        command = [str(GATE), "serve", str(path), "--host", "127.0.0.1", "--port", str(self.port)]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=dict(os.environ))

    def wait_ready(self, timeout_s: float = 240.0) -> None:
        """Poll /ready until 200 (the process dying or the time passing fails the test)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"gate serve exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.base_url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("gate serve never became ready")

    def stop(self) -> int:
        """SIGTERM, wait, return the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode
