"""runtime.backend: vllm without vLLM: the manifest's mapping, its refusals, and a missing interpreter."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from support.manifests import served_model

from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.remote.vllm_backend import find_python, launch_key, vllm_arguments, vllm_launch


def vllm_manifest(**sections: Any) -> ServedModel:
    data: dict[str, Any] = {
        "name": "tiny",
        "weights": {"source": "zoo:tiny-primary"},
        "runtime": {"backend": "vllm", "dtype": "float32", "device": "cpu", "max_model_len": 256,
                    "kv_cache": {"block_size": 32, "memory_budget": "64MiB", "prefix_caching": False},
                    "vllm": {"python": sys.executable}},
        "batching": {"mode": "continuous", "max_batch_size": 16, "max_num_batched_tokens": 512},
        "preprocess": {"max_input_tokens": 128},
        "postprocess": {"max_output_tokens": 32},
    }  # fmt: skip
    return served_model(data, **sections)


def test_the_manifest_becomes_vllm_arguments_in_a_config_file(tmp_path: Path) -> None:
    launch = vllm_launch(vllm_manifest(), tmp_path, port=8123)
    command = launch.command()
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--max-model-len") + 1] == "256" and command[command.index("--dtype") + 1] == "float32"
    config = json.loads(Path(command[command.index("--config") + 1]).read_text())
    assert config["max-num-seqs"] == 16 and config["max-num-batched-tokens"] == 512
    assert config["kv-cache-memory-bytes"] == 64 * 2**20 and config["block-size"] == 32
    assert config["enable-prefix-caching"] is False and config["enable-chunked-prefill"] is False
    assert "VLLM_CPU_KVCACHE_SPACE" not in launch.environment({})  # the byte budget is given instead


def test_a_field_vllm_would_serve_differently_is_an_error_naming_it() -> None:
    with pytest.raises(ServegateError) as caught:
        vllm_arguments(vllm_manifest(batching={"mode": "dynamic"}), "model")
    assert "batching.mode" in str(caught.value) and "continuously" in str(caught.value)
    with pytest.raises(ServegateError, match="runtime.quantization.method"):
        vllm_arguments(vllm_manifest(runtime={"quantization": {"method": "int2-weight"}}), "model")


def test_a_missing_vllm_interpreter_says_how_to_get_one(tmp_path: Path) -> None:
    served = vllm_manifest(runtime={"vllm": {"python": str(tmp_path / "nope" / "python")}})
    with pytest.raises(ServegateError, match="make vllm-venv"):
        find_python(served.runtime.vllm)  # type: ignore[arg-type]


def test_manifests_that_differ_only_in_front_of_vllm_share_a_server() -> None:
    base = vllm_manifest()
    stricter = vllm_manifest(failure_policy={"max_queue": 1, "request_timeout_s": 1})
    other = vllm_manifest(batching={"max_batch_size": 4})
    assert launch_key(base) == launch_key(stricter)
    assert launch_key(base) != launch_key(other)


def test_endpoint_url_and_vllm_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="remove endpoint_url"):
        vllm_manifest(runtime={"endpoint_url": "http://127.0.0.1:1/v1"})
    with pytest.raises(ValueError, match="runtime.vllm configures backend: vllm"):
        ServedModel.model_validate({"name": "x", "weights": {"source": "zoo:tiny-primary"},
                                    "runtime": {"vllm": {"port": 1}}})  # fmt: skip
    with pytest.raises(ValueError, match="extra_args cannot set --port"):
        vllm_manifest(runtime={"vllm": {"extra_args": ["--port", "1"]}})


def test_checkpoints_vllm_cannot_run_on_cpu_are_errors_with_vllms_reason() -> None:
    gguf = {"source": "zoo:tiny-primary", "format": "gguf", "gguf_file": "model.gguf"}
    with pytest.raises(ServegateError, match="no GGUF loader"):
        vllm_arguments(vllm_manifest(weights=gguf), "model")
    compressed = {"source": "zoo:tiny-primary", "format": "compressed-tensors"}
    with pytest.raises(ServegateError, match="bfloat16 only"):
        vllm_arguments(vllm_manifest(weights=compressed), "model")
    args = vllm_arguments(vllm_manifest(weights=compressed, runtime={"dtype": "bfloat16"}), "model")
    assert args.args["load-format"] == "safetensors" and args.args["dtype"] == "bfloat16"
