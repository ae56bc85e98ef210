"""runtime.backend: llamacpp without llama-server: the mapping onto its flags, its refusals, a missing binary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.remote_scope import remote_scope
from servegate.runtime.remote.gguf_header import GgufHeader
from servegate.runtime.remote.llamacpp_args import command_line, server_args
from servegate.runtime.remote.llamacpp_backend import launch_key, llamacpp_arguments, server_binary
from servegate.runtime.remote.llamacpp_process import LlamaCppLaunch, find_server

HEADER = GgufHeader(
    path=Path("/models/m.Q8_0.gguf"),
    architecture="llama",
    context_length=2048,
    layers=30,
    kv_width=192,
    file_type="Q8_0",
    chat_template=True,
)
"""A SmolLM2-135M-shaped header: 30 layers, 3 KV heads of 64, trained on 2048 tokens."""


def llama_manifest(**sections: Any) -> ServedModel:
    data: dict[str, Any] = {
        "name": "smol",
        "weights": {"source": "zoo:tiny-primary", "format": "gguf", "gguf_file": "m.Q8_0.gguf"},
        "runtime": {
            "backend": "llamacpp",
            "dtype": "float32",
            "device": "cpu",
            "max_model_len": 512,
            "threads": 2,
            "seed": 7,
            "kv_cache": {"memory_budget": "128MiB"},
        },
        "batching": {"mode": "continuous", "max_batch_size": 4, "max_num_batched_tokens": 1024},
        "preprocess": {"max_input_tokens": 256},
        "postprocess": {"max_output_tokens": 32},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return ServedModel.model_validate(data)


def arguments(served: ServedModel) -> dict[str, Any]:
    return llamacpp_arguments(served, HEADER.path, HEADER).args


def test_each_element_becomes_a_llama_server_flag() -> None:
    args = arguments(llama_manifest())
    assert args["model"] == "/models/m.Q8_0.gguf" and args["alias"] == "smol"
    assert args["parallel"] == 4 and args["cont-batching"] is True
    assert args["ctx-size"] == 4 * 512 and args["no-kv-unified"] is True  # every slot gets max_model_len
    assert args["batch-size"] == 1024 and args["ubatch-size"] == 512
    assert args["cache-type-k"] == args["cache-type-v"] == "f32"  # float32 compute keeps float32 keys and values
    assert args["threads"] == args["threads-batch"] == 2 and args["seed"] == 7 and args["n-gpu-layers"] == 0
    assert args["no-cache-prompt"] is True and args["cache-ram"] == 0  # no prefix cache: no request reuses another's
    # llama.cpp's own defaults (top-k 40, min-p 0.05, top-p 0.95) would reshape every request that leaves them out
    assert (args["repeat-penalty"], args["top-k"], args["min-p"], args["top-p"]) == (1.0, 0, 0.0, 1.0)


def test_the_command_line_spells_flags_and_values() -> None:
    cmd = command_line("llama-server", {"alias": "m", "jinja": True, "no-webui": True, "ctx-size": 640, "x": None})
    assert cmd == ["llama-server", "--alias", "m", "--jinja", "--no-webui", "--ctx-size", "640"]
    launch = LlamaCppLaunch(binary=Path("/bin/llama-server"), args={"alias": "m"}, port=9000)
    assert launch.command()[-4:] == ["--host", "127.0.0.1", "--port", "9000"]
    assert "OMP_NUM_THREADS" not in launch.environment({"OMP_NUM_THREADS": "1", "PATH": "/bin"})


def test_a_template_file_and_a_prefix_cache_and_the_micro_batch_are_mapped(tmp_path: Path) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages[0].content }}")
    served = llama_manifest(
        preprocess={"chat_template": str(template)},
        runtime={
            "kv_cache": {"memory_budget": "128MiB", "prefix_caching": True, "cache_scope": "global"},
            "llamacpp": {"ubatch_size": 128, "cache_reuse": 64},
        },
    )
    args = arguments(served)
    assert args["jinja"] is True and args["chat-template-file"] == str(template)
    assert "no-cache-prompt" not in args and args["cache-reuse"] == 64 and args["ubatch-size"] == 128


@pytest.mark.parametrize(
    ("sections", "field", "words"),
    [
        ({"batching": {"mode": "dynamic"}}, "batching.mode", "continuously"),
        ({"weights": {"format": "safetensors", "gguf_file": None}}, "weights.format", "GGUF files only"),
        (
            {
                "weights": {"format": "safetensors", "gguf_file": None},
                "runtime": {"quantization": {"method": "int8-weight"}},
            },
            "runtime.quantization.method",
            "llama-quantize",
        ),
        ({"runtime": {"max_model_len": 4096}}, "runtime.max_model_len", "trained with"),
        ({"runtime": {"kv_cache": {"dtype": "fp8"}}}, "runtime.kv_cache.dtype", "no fp8"),
        ({"runtime": {"dtype": "bfloat16"}}, "runtime.dtype", "float32"),
        ({"batching": {"max_batch_size": 16}}, "runtime.kv_cache.memory_budget", "over the budget"),
        (
            {"runtime": {"kv_cache": {"memory_budget": "128MiB", "prefix_caching": True}}},
            "runtime.kv_cache.cache_scope",
            "belongs to a slot",
        ),
        ({"postprocess": {"structured_output": {}}}, "postprocess.structured_output.kinds", "regex"),
        (
            {"postprocess": {"structured_output": {"kinds": ["json_schema"], "whitespace": "compact"}}},
            "postprocess.structured_output.whitespace",
            "whitespace: any",
        ),
    ],
)
def test_a_field_llamacpp_would_serve_differently_is_an_error_naming_it(
    sections: dict[str, Any], field: str, words: str
) -> None:
    served = llama_manifest(**sections)
    with pytest.raises(ServegateError) as caught:
        llamacpp_arguments(served, HEADER.path, HEADER)
    message = str(caught.value)
    assert f"cannot serve {field} =" in message and words in message, message


def test_the_kv_the_slots_need_is_reckoned_from_the_gguf_header() -> None:
    # 2 (K, V) x 30 layers x 192 wide x 4 slots x 512 tokens x 4 bytes = 94,371,840 bytes: inside 128 MiB
    assert HEADER.kv_bytes(4 * 512, 4.0) == 94_371_840
    notes = {r.field: r.reason for r in llamacpp_arguments(llama_manifest(), HEADER.path, HEADER).residuals}
    assert "94371840 bytes" in notes["runtime.kv_cache.memory_budget"]
    assert "Q8_0" in notes["weights.gguf_file"]


def test_an_export_for_another_machine_maps_without_the_file() -> None:
    mapped = server_args(llama_manifest(runtime={"max_model_len": 4096}, batching={"max_batch_size": 1}), "m.gguf")
    assert mapped.args["ctx-size"] == 4096  # no header: the trained length is not known here, nothing refused


def test_a_missing_server_binary_names_the_make_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVEGATE_LLAMACPP_SERVER", raising=False)
    served = llama_manifest(runtime={"llamacpp": {"server": str(tmp_path / "nope" / "llama-server")}})
    with pytest.raises(ServegateError, match="make llamacpp"):
        server_binary(served)
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("SERVEGATE_LLAMACPP_SERVER", str(binary))
    assert find_server(None, [tmp_path]) == binary


def test_manifests_that_differ_only_in_front_of_llamacpp_share_a_server() -> None:
    base = llama_manifest()
    assert launch_key(base) == launch_key(llama_manifest(postprocess={"max_output_tokens": 8}))
    assert launch_key(base) != launch_key(llama_manifest(batching={"max_batch_size": 2}))


def test_remote_scope_says_what_servegate_sets_checks_and_only_records() -> None:
    scope = remote_scope(llama_manifest())
    assert scope is not None
    assert "batching.max_num_batched_tokens" in scope["set_at_launch"]
    assert "preprocess.tokenizer" in scope["verified_on_remote"]
    assert "cache_prompt: false" in scope["verified_on_remote"]["runtime.kv_cache.cache_scope"]
    assert scope["declared_not_verified"]["runtime.kv_cache.block_size"] == 16


def test_the_backend_section_belongs_to_its_backend() -> None:
    with pytest.raises(ValueError, match="runtime.llamacpp configures backend: llamacpp"):
        ServedModel.model_validate(
            {"name": "x", "weights": {"source": "zoo:tiny-primary"}, "runtime": {"llamacpp": {"port": 9000}}}
        )
    with pytest.raises(ValueError, match="extra_args cannot set --port"):
        llama_manifest(runtime={"llamacpp": {"extra_args": ["--port", "1"]}})
    assert llama_manifest(runtime={"llamacpp": {"port": 9000}}).reference_form().runtime.backend == "reference"


def test_prompt_scoring_is_refused_since_llama_server_echoes_no_prompt_logprobs() -> None:
    from servegate.runtime.remote.llamacpp_backend import LlamaCppEngine
    from servegate.runtime.types import ErrorEvent, GenerationRequest

    engine = LlamaCppEngine(llama_manifest(runtime={"llamacpp": {"port": 9}}))
    assert not engine.scores_prompts
    (answer,) = engine.score([GenerationRequest(id="s", prompt="1+1=")])
    assert isinstance(answer, ErrorEvent) and answer.error.param == "echo"
