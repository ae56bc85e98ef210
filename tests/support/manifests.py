"""Manifests for tests: factories of the common shapes, and writing them to disk for servers and subprocesses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servegate.contracts.files import write_atomic
from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel


def write_manifest(folder: Path, data: dict[str, Any] | str, name: str = "manifest.json") -> Path:
    """Write a manifest (a dict as JSON, or YAML text as it is), atomically, and return its path."""
    return write_atomic(folder / name, data if isinstance(data, str) else json.dumps(data, indent=2))


def manifest_file(path: Path, text: str) -> ServedModel:
    """Write manifest text to `path` and load it the way `gate` does."""
    return load_manifest(write_manifest(path.parent, text, path.name))


def merged_manifest(defaults: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """The one manifest factory of the tests: `defaults` (a test module's shape) with each of `sections` merged
    over it, a dict into that section's fields, any other value (None included) in its place."""
    data = dict(defaults)
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return data


def served_model(defaults: dict[str, Any], **sections: Any) -> ServedModel:
    """`merged_manifest(defaults, **sections)`, validated."""
    return ServedModel.model_validate(merged_manifest(defaults, **sections))


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
    return merged_manifest(data, **sections)


def fake_manifest(**sections: Any) -> dict[str, Any]:
    """A manifest for the fault engine (the weights are never loaded); sections override the defaults."""
    data: dict[str, Any] = {
        "apiVersion": "servegate/v1",
        "kind": "ServedModel",
        "name": "fake-model",
        "weights": {"source": "zoo:tiny-primary"},
        "preprocess": {"max_input_tokens": 64, "max_payload_bytes": 4096},
        "runtime": {"max_model_len": 128},
        "postprocess": {"max_output_tokens": 32, "logprobs": True},
    }
    return merged_manifest(data, **sections)


BATCHING_MODES: dict[str, dict[str, Any]] = {
    "none": {"batching": {"mode": "none"}, "runtime": {"kv_cache": None}},
    "static": {"batching": {"mode": "static", "max_batch_size": 6, "max_wait_ms": 1}, "runtime": {"kv_cache": None}},
    "dynamic": {"batching": {"mode": "dynamic", "max_batch_size": 6, "max_wait_ms": 1}, "runtime": {"kv_cache": None}},
    "continuous": {"batching": {"mode": "continuous", "max_batch_size": 8}},
    "offline": {"batching": {"mode": "offline", "max_batch_size": 8}},
    "chunked": {"batching": {"mode": "continuous", "max_num_batched_tokens": 8, "chunked_prefill": True}},
}
"""Manifest sections (merged over a test manifest's) for every batching mode, and chunked prefill."""
