"""What a quantized checkpoint says about itself: compressed-tensors' config, a GGUF's header (the real SmolLM2
file when `make fetch` has run), and how the reference runtime loads each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkpoints import build_compressed

from servegate.contracts.errors import ServegateError
from servegate.runtime.model.checkpoint_scheme import architecture_problems, read_scheme
from servegate.zoo import zoo_model_path

SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def w4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """zoo:tiny-primary quantized to 4-bit weights in groups of 16, written by compressed-tensors."""
    return build_compressed(Path(zoo_model_path("tiny-primary")), tmp_path_factory.mktemp("w4") / "w4", bits=4,
                            group_size=16)  # fmt: skip


def test_a_compressed_tensors_scheme_is_read_from_its_config(w4: Path) -> None:
    scheme = read_scheme(w4, "compressed-tensors")
    assert (scheme.scheme, scheme.weight_bits, scheme.group_size, scheme.storage) == ("W4A16", 4, 16, "pack-quantized")
    assert scheme.activations is None and scheme.ignored == ("lm_head",) and scheme.toolchain is None
    assert scheme.summary() == "compressed-tensors W4A16, group 16"


def test_a_build_record_names_the_toolchain_and_calibration(w4: Path, tmp_path: Path) -> None:
    import shutil

    built = tmp_path / "built"
    shutil.copytree(w4, built)
    record = {"toolchain": "llm-compressor", "toolchain_version": "0.14.0.1",
              "calibration": {"file": "calibration.jsonl", "sha256": "ab" * 32, "samples": 64}}  # fmt: skip
    (built / "servegate-build.json").write_text(json.dumps(record), encoding="utf-8")
    scheme = read_scheme(built, "compressed-tensors")
    assert scheme.toolchain == "llm-compressor 0.14.0.1"
    assert "calibrated on calibration.jsonl (64 samples)" in scheme.summary()


def test_static_activation_scales_are_refused_naming_the_file(w4: Path, tmp_path: Path) -> None:
    import shutil

    static = tmp_path / "static"
    shutil.copytree(w4, static)
    config = json.loads((static / "config.json").read_text(encoding="utf-8"))
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {
        "num_bits": 8, "type": "int", "dynamic": False, "strategy": "tensor"}  # fmt: skip
    (static / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ServegateError) as caught:
        read_scheme(static, "compressed-tensors")
    assert str(static / "config.json") in str(caught.value) and "static" in str(caught.value)


def test_architecture_differences_are_named_key_by_key() -> None:
    parent = {"num_hidden_layers": 30, "vocab_size": 49152, "hidden_size": 576}
    problems = architecture_problems(parent, {**parent, "num_hidden_layers": 28}, "candidate")
    assert problems == [problems[0]] and "num_hidden_layers is 28 but the parent's is 30" in problems[0]
    assert architecture_problems(parent, dict(parent), "candidate") == []


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """The fetched SmolLM2 folder with its GGUF kept beside the conversion."""
    from servegate.zoo import ZooError

    try:
        folder = Path(zoo_model_path(SMOLLM2))
    except ZooError:
        pytest.skip(f"zoo:{SMOLLM2} is not fetched: run `make fetch`")
    if not list(folder.glob("*.gguf")):
        pytest.skip(f"zoo:{SMOLLM2} was fetched before its GGUF was kept: run `gate zoo fetch {SMOLLM2} --force`")
    return folder


def test_the_real_gguf_header_gives_its_quant_type(smollm2: Path) -> None:
    scheme = read_scheme(smollm2, "gguf")
    assert scheme.scheme == "Q4_1" and scheme.weight_bits == 4
    assert "Q4_1 x210" in str(scheme.storage) and "llama" in str(scheme.toolchain)


def test_the_gguf_runs_as_its_safetensors_conversion(smollm2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from servegate.contracts.manifest import ServedModel
    from servegate.runtime.model.weights import load_causal_lm

    def load(weights: dict[str, str]):  # noqa: ANN202
        return load_causal_lm(ServedModel.model_validate({"name": "m", "weights": weights, "runtime": {"threads": 1}}))

    gguf = load({"source": f"zoo:{SMOLLM2}", "format": "gguf"})
    plain = load({"source": f"zoo:{SMOLLM2}"})
    ids = gguf.tokenizer("The capital of France is", return_tensors="pt").input_ids
    assert ids.tolist() == plain.tokenizer("The capital of France is", return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        gap = (gguf.model(ids).logits - plain.model(ids).logits).abs().max().item()
    assert gap < 1e-3, gap  # the same Q4_1 dequantization: the conversion saved exactly these weights
    # the dequantized file was kept: a second load never reads the GGUF's tensors again
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the GGUF was dequantized again")

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", refuse)
    again = load({"source": f"zoo:{SMOLLM2}", "format": "gguf"})
    with torch.no_grad():
        assert torch.equal(again.model(ids).logits, gguf.model(ids).logits)


def test_gate_validate_shows_a_gguf_scheme_and_asks_for_its_parent(smollm2: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "gguf.yaml"
    manifest.write_text(f"name: m\nweights: {{source: 'zoo:{SMOLLM2}', format: gguf}}\n", encoding="utf-8")
    wide = {**os.environ, "COLUMNS": "300"}
    done = subprocess.run([sys.executable, "-m", "servegate.cli", "validate", str(manifest), "--json", "-"],
                          capture_output=True, text=True, timeout=300, env=wide)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "checkpoint: gguf Q4_1" in done.stderr and "no weights.derived_from" in done.stderr  # the table: stderr
    assert json.loads(done.stdout)["checkpoint"]["scheme"] == "Q4_1"
    (tmp_path / "two.yaml").write_text(
        f"name: m\nweights: {{source: 'zoo:{SMOLLM2}', format: gguf, gguf_file: other.gguf}}\n", encoding="utf-8"
    )
    done = subprocess.run([sys.executable, "-m", "servegate.cli", "validate", str(tmp_path / "two.yaml")],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2 and "weights.gguf_file other.gguf: no such file" in done.stderr


def test_a_gptq_folder_in_its_own_layout_is_refused_with_the_way_out(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "gptq", "bits": 4}}),
        encoding="utf-8",
    )
    with pytest.raises(ServegateError) as caught:
        read_scheme(tmp_path, "safetensors")
    assert "quantized with gptq" in str(caught.value) and "compressed-tensors" in str(caught.value)
    assert read_scheme(Path(zoo_model_path("tiny-primary")), "safetensors").scheme == "none"


def test_a_gguf_tensor_type_without_a_dequantizer_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gguf
    import numpy as np

    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path / "home"))  # the header is kept here, not in the runner's home

    kind = gguf.GGMLQuantizationType.Q8_1  # llama.cpp's activation type: the gguf package cannot dequantize it
    _, size = gguf.GGML_QUANT_SIZES[kind]  # (weights per block, bytes per block)
    writer = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), "llama")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 2 * size), dtype=np.uint8), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ServegateError) as caught:
        read_scheme(tmp_path, "gguf")
    assert "GGUF tensor type Q8_1 has no dequantizer" in str(caught.value) and "odd.gguf" in str(caught.value)


def test_a_gguf_folder_alone_gives_the_capacity_commands_its_tokenizer_and_shape(smollm2: Path, tmp_path: Path) -> None:
    # a folder holding only the GGUF, as `make gguf-builds` writes: no config.json, no tokenizer files
    from servegate.capacity.bench.own_server import manifest_tokenizer
    from servegate.capacity.bench.targets import PromptFactory
    from servegate.capacity.memory.plan import manifest_config, manifest_memory
    from servegate.contracts.manifest import ServedModel

    [gguf] = smollm2.glob("*.gguf")
    (tmp_path / gguf.name).symlink_to(gguf)
    served = ServedModel.model_validate(
        {"name": "m", "weights": {"source": str(tmp_path), "format": "gguf"}, "runtime": {"max_model_len": 1280}}
    )
    tokenizer = manifest_tokenizer(served)
    assert tokenizer is not None  # prompt lengths are exact, not guessed from characters
    assert len(tokenizer(PromptFactory(tokenizer, seed=1).text(96))["input_ids"]) == 96
    config = manifest_config(served)
    assert (config["model_type"], config["num_hidden_layers"], config["num_key_value_heads"]) == ("llama", 30, 3)
    assert manifest_memory(served).kv_bytes_per_token == 30 * 2 * 3 * 64 * 4  # layers x K,V x heads x dim x fp32
    # the reference runtime holds the file dequantized; llama.cpp maps its Q4_1 tensors as stored
    dequantized = manifest_memory(served)
    served_by_llamacpp = served.with_changes(runtime={"backend": "llamacpp", "max_model_len": 1280})
    as_stored = manifest_memory(served_by_llamacpp)
    assert dequantized.weights_bytes > 500 * 2**20  # 134.5M parameters x 4 bytes
    file_bytes = gguf.stat().st_size
    assert 0.9 * file_bytes < as_stored.weights_bytes < file_bytes  # the tensors, without the header's vocabulary
    assert as_stored.kv_bytes_per_token == dequantized.kv_bytes_per_token
