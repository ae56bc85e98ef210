"""Weight loading: sources, checksums, the pickle opt-in, device and dtype."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import transformers as hf
from support.models import char_llama

from servegate.contracts.errors import ServegateError
from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.runtime.model.weights import (
    load_causal_lm,
    resolve_dtype,
    resolve_weights_dir,
    sha256_of,
    verify_checksums,
)
from servegate.zoo.tokenizer import build_char_tokenizer


@pytest.fixture(scope="module")
def original() -> hf.LlamaForCausalLM:
    return char_llama()


@pytest.fixture
def model_dir(tmp_path: Path, original: hf.LlamaForCausalLM) -> Path:
    directory = tmp_path / "model"
    original.save_pretrained(directory)
    build_char_tokenizer().save_pretrained(directory)
    return directory


def manifest(source: str, **weights: object) -> ServedModel:
    return ServedModel.model_validate({"name": "t", "weights": {"source": source, **weights}})


def greedy(model: torch.nn.Module, ids: list[int]) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def test_local_directory_loads_the_same_model(model_dir: Path, original: hf.LlamaForCausalLM) -> None:
    digest = sha256_of(model_dir / "model.safetensors")
    loaded = load_causal_lm(manifest(str(model_dir), sha256={"model.safetensors": digest}))
    assert loaded.device == torch.device("cpu") and loaded.dtype == torch.float32
    assert loaded.weights_dir == model_dir
    assert loaded.model.config._attn_implementation == "servegate_paged"
    ids = loaded.tokenizer("12+3=")["input_ids"]
    assert ids[0] == 1  # the tokenizer's own BOS
    assert greedy(loaded.model, ids) == greedy(original, ids)


def test_relative_source_is_resolved_against_the_manifest(model_dir: Path) -> None:
    path = model_dir.parent / "served.yaml"
    path.write_text("name: t\nweights:\n  source: ./model\n")
    served = load_manifest(path)
    assert resolve_weights_dir(served) == model_dir


def test_checksum_mismatch_names_file_expected_and_actual(model_dir: Path) -> None:
    wrong = "0" * 64
    actual = sha256_of(model_dir / "model.safetensors")
    with pytest.raises(ServegateError) as err:
        load_causal_lm(manifest(str(model_dir), sha256={"model.safetensors": wrong}))
    message = str(err.value)
    assert "model.safetensors" in message and wrong in message and actual in message


def test_listed_file_that_is_missing_is_refused(model_dir: Path) -> None:
    with pytest.raises(ServegateError, match="extra.safetensors"):
        verify_checksums(model_dir, {"extra.safetensors": "a" * 64})


def test_pickle_weights_need_the_opt_in(tmp_path: Path, original: hf.LlamaForCausalLM) -> None:
    directory = tmp_path / "pickled"
    original.config.save_pretrained(directory)
    build_char_tokenizer().save_pretrained(directory)
    torch.save(original.state_dict(), directory / "pytorch_model.bin")
    with pytest.raises(ServegateError, match="pytorch_model.bin.*allow_pickle: true"):
        load_causal_lm(manifest(str(directory)))
    loaded = load_causal_lm(manifest(str(directory), format="pickle", allow_pickle=True))
    ids = [1, 20, 21, 22]
    assert greedy(loaded.model, ids) == greedy(original, ids)


def test_directory_without_weights_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ServegateError, match="no weight files"):
        load_causal_lm(manifest(str(tmp_path)))
    with pytest.raises(ServegateError, match="not a directory"):
        resolve_weights_dir(manifest(str(tmp_path / "absent")))


def test_hub_source_offline_fails_at_once_with_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    with pytest.raises(ServegateError) as err:
        resolve_weights_dir(manifest("hf:servegate-test/absent-model@v1"))
    assert time.monotonic() - started < 10
    message = str(err.value)
    assert "hf:servegate-test/absent-model@v1" in message and "offline" in message
    assert "weights.source" in message and "download" in message


def test_unknown_zoo_model_is_refused() -> None:
    with pytest.raises(ServegateError, match="zoo:no-such-model"):
        resolve_weights_dir(manifest("zoo:no-such-model"))


def test_weight_dtype_rounds_and_runtime_dtype_computes(model_dir: Path, original: hf.LlamaForCausalLM) -> None:
    served = ServedModel.model_validate(
        {"name": "t", "weights": {"source": str(model_dir), "dtype": "bfloat16"}, "runtime": {"threads": 1}}
    )
    threads = torch.get_num_threads()
    try:
        loaded = load_causal_lm(served)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    weight = loaded.model.model.layers[0].mlp.up_proj.weight
    assert weight.dtype == torch.float32
    expected = original.model.layers[0].mlp.up_proj.weight.to(torch.bfloat16).float()
    assert torch.equal(weight, expected)


def test_auto_dtype_follows_the_device() -> None:
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_is_refused(model_dir: Path) -> None:
    served = ServedModel.model_validate(
        {"name": "t", "weights": {"source": str(model_dir)}, "runtime": {"device": "cuda"}}
    )
    with pytest.raises(ServegateError, match="no CUDA device"):
        load_causal_lm(served)
