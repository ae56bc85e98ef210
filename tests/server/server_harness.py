"""Start server processes on 127.0.0.1 and a free port for the server tests: `gate serve`, or the fake engine.

A module of its own (not conftest.py) so test modules import it by a name no other test folder uses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from support.manifests import write_manifest
from support.servers import ServerProcess

from servegate.capacity.bench.local_server import free_port

HERE = Path(__file__).parent
GATE = Path(sys.executable).with_name("gate")


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


def start_fake_server(folder: Path, manifest: dict[str, Any], behaviour: dict[str, Any] | None = None) -> ServerProcess:
    """The fake-engine server on a free port (same app and runner as `gate serve`)."""
    path = write_manifest(folder, manifest)
    port = free_port()
    command = [sys.executable, str(HERE / "serve_fake.py"), str(path), str(port), json.dumps(behaviour or {})]
    return ServerProcess.spawn(command, folder / "server.log", port)


def start_gate_serve(folder: Path, manifest: dict[str, Any], *extra: str) -> ServerProcess:
    """`gate serve MANIFEST --port N` on a free port."""
    path = write_manifest(folder, manifest)
    port = free_port()
    command = [str(GATE), "serve", str(path), "--host", "127.0.0.1", "--port", str(port), *extra]
    return ServerProcess.spawn(command, folder / "server.log", port)
