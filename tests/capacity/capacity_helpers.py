"""Test factories: a tiny Llama config on disk (no weights) and manifests that point at it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.terms import ServingOverheads, StepCost
from servegate.contracts.manifest import ServedModel

TINY_LLAMA = {
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def write_model_dir(tmp_path: Path) -> Path:
    """A directory holding only a tiny Llama config.json."""
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    return d


def manifest(model_dir: Path, **sections: Any) -> ServedModel:
    """A manifest serving the tiny config with the given sections."""
    data: dict[str, Any] = {
        "name": "tiny",
        "weights": {"source": str(model_dir)},
        "preprocess": {"max_input_tokens": 64},
        "postprocess": {"max_output_tokens": 32},
        "runtime": {"device": "cpu", "dtype": "float32", "max_model_len": 128,
                    "kv_cache": {"block_size": 16, "memory_budget": "4MiB"}},
        "batching": {"mode": "continuous", "max_batch_size": 8, "max_num_batched_tokens": 256},
    }  # fmt: skip
    data.update(sections)
    return ServedModel.model_validate(data)


# 5 ms per step + 0.1 ms per prompt token + 1 ms per decoding sequence, 2 ms around each request
STEP_MODEL = LatencyModel(
    StepCost(c_step=0.005, c_prefill_token=0.0001, c_decode_seq=0.001),
    ServingOverheads(request_s=0.002, finish_s=0.0),
)
