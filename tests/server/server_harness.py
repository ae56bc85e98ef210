"""Start and stop real server processes on 127.0.0.1 and a free port: `gate serve`, or the fake engine.

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

HERE = Path(__file__).parent
GATE = Path(sys.executable).with_name("gate")


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_manifest(folder: Path, data: dict[str, Any], name: str = "manifest.json") -> Path:
    """Write a manifest dict as JSON (manifests may be YAML or JSON) and return its path."""
    path = folder / name
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def tiny_llama(folder: Path) -> Path:
    """A tiny random Llama (2 layers, hidden 32) with the zoo's character tokenizer, saved as safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from servegate.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_char_tokenizer, vocabulary

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocabulary()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    build_char_tokenizer().save_pretrained(folder)
    return folder


def real_manifest(weights: str, **sections: Any) -> dict[str, Any]:
    """A manifest for the reference engine: continuous batching over a paged KV cache, small limits."""
    data: dict[str, Any] = {
        "apiVersion": "servegate/v1",
        "kind": "ServedModel",
        "name": "tiny",
        "weights": {"source": weights},
        "preprocess": {"chat_template": "none", "max_input_tokens": 64, "max_payload_bytes": 4096},
        "runtime": {
            "max_model_len": 128,
            "threads": 1,
            "kv_cache": {"block_size": 16, "memory_budget": "4MiB"},
        },
        "batching": {"mode": "continuous", "max_batch_size": 8, "max_num_batched_tokens": 256},
        "postprocess": {"max_output_tokens": 32, "logprobs": True},
        "failure_policy": {"max_queue": 64, "request_timeout_s": 30},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return data


def fake_manifest(**sections: Any) -> dict[str, Any]:
    """A manifest for the fake engine (the weights are never loaded); sections override the defaults."""
    data: dict[str, Any] = {
        "apiVersion": "servegate/v1",
        "kind": "ServedModel",
        "name": "fake-model",
        "weights": {"source": "zoo:tiny-primary"},
        "preprocess": {"max_input_tokens": 64, "max_payload_bytes": 4096},
        "runtime": {"max_model_len": 128},
        "postprocess": {"max_output_tokens": 32, "logprobs": True},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return data


class ServerProcess:
    """One server subprocess; its stdout and stderr go to a log file the tests can read."""

    def __init__(self, command: list[str], log_path: Path, port: int) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SERVEGATE_DEBUG": ""}
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_until(self, path: str, status: int, timeout_s: float = 120.0) -> None:
        """Poll GET path until it answers `status` (the process dying or the time passing fails the test)."""
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                last = httpx.get(self.base_url + path, timeout=2.0).status_code
                if last == status:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"GET {path} never answered {status} (last {last}):\n{self.log()[-4000:]}")

    def url(self, path: str) -> str:
        """Absolute URL of a path on this server."""
        return self.base_url + path

    def log(self) -> str:
        """Everything the server printed so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, wait for the exit, return the exit code (killed after timeout_s)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


def start_fake_server(folder: Path, manifest: dict[str, Any], behaviour: dict[str, Any] | None = None) -> ServerProcess:
    """The fake-engine server on a free port (same app and runner as `gate serve`)."""
    path = write_manifest(folder, manifest)
    port = free_port()
    command = [sys.executable, str(HERE / "serve_fake.py"), str(path), str(port), json.dumps(behaviour or {})]
    return ServerProcess(command, folder / "server.log", port)


def start_gate_serve(folder: Path, manifest: dict[str, Any], *extra: str) -> ServerProcess:
    """`gate serve MANIFEST --port N` on a free port."""
    path = write_manifest(folder, manifest)
    port = free_port()
    command = [str(GATE), "serve", str(path), "--host", "127.0.0.1", "--port", str(port), *extra]
    return ServerProcess(command, folder / "server.log", port)
