"""What servegate reads from a llama.cpp build's GGUF header and record (scripts/build_gguf.py writes them), and
which GGUF may be a quantized build's parent. Small GGUFs are written here with the gguf package: the header is
all these checks read; tests/toolchain/test_llamacpp_builds.py runs the real builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servegate.cli.preflight import gguf_parent_problems
from servegate.contracts.loading import load_manifest
from servegate.runtime.model.checkpoint_scheme import read_scheme


@pytest.fixture(autouse=True)
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The headers read here are kept (runtime/model/gguf_kept.py) in this test's home, not the runner's."""
    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path / "home"))


def write_gguf(path: Path, file_type: str, tensors: dict[str, tuple[str, int]]) -> Path:
    """A GGUF whose header says `file_type` (a gguf.LlamaFileType name) and holds each tensor as
    name -> (GGML type, rows), of zero blocks 256 weights wide (every block type's width divides 256)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_file_type(gguf.LlamaFileType[file_type])
    for name, (kind, rows) in tensors.items():
        quant = gguf.GGMLQuantizationType[kind]
        per_block, size = gguf.GGML_QUANT_SIZES[quant]
        writer.add_tensor(name, np.zeros((rows, 256 // per_block * size), dtype=np.uint8), raw_dtype=quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_k_quant_mix_names_the_types_its_tensors_really_hold(tmp_path: Path) -> None:
    # As llama-quantize writes Q4_K_M for a model whose rows are not a multiple of 256: mostly the fallback Q5_0
    write_gguf(tmp_path / "m-Q4_K_M.gguf", "MOSTLY_Q4_K_M",
               {"a": ("Q5_0", 4), "b": ("Q5_0", 4), "c": ("Q4_K", 4), "d": ("Q6_K", 4), "n": ("F32", 1)})  # fmt: skip
    scheme = read_scheme(tmp_path, "gguf")
    assert (scheme.scheme, scheme.weight_bits, scheme.quantized) == ("Q4_K_M", 5, True)
    assert scheme.storage == "F32 x1, Q4_K x1, Q5_0 x2, Q6_K x1"
    assert scheme.summary() == "gguf Q4_K_M (Q4_K x1, Q5_0 x2, Q6_K x1), by llama.cpp (GGUF)"
    assert any("2 of 4 quantized tensors are Q5_0, not the Q4_K_M" in note for note in scheme.notes)


def test_the_build_record_gives_the_tools_version_and_command(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m-Q8_0.gguf", "MOSTLY_Q8_0", {"a": ("Q8_0", 2), "b": ("Q8_0", 2), "c": ("Q6_K", 2)})
    record = {"toolchain": "llama.cpp", "toolchain_version": "0.5.0-dev (build 1, commit 0c1e570)",
              "command": "llama-quantize m-F16.gguf m-Q8_0.gguf Q8_0", "source": {"file": "m-F16.gguf",
              "sha256": "ab" * 32}}  # fmt: skip
    (tmp_path / "servegate-build.json").write_text(json.dumps(record), encoding="utf-8")
    scheme = read_scheme(tmp_path, "gguf")
    assert scheme.toolchain == "llama.cpp 0.5.0-dev (build 1, commit 0c1e570)"
    assert "built by `llama-quantize m-F16.gguf m-Q8_0.gguf Q8_0` from m-F16.gguf (sha256 abababab" in scheme.notes[-1]
    assert (scheme.weight_bits, scheme.quantized) == (8, True)
    assert not any("quantized tensors are" in note for note in scheme.notes)  # the file type is what most hold


def test_an_f16_gguf_is_not_quantized(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m-F16.gguf", "MOSTLY_F16", {"a": ("F16", 2), "n": ("F32", 1)})
    scheme = read_scheme(tmp_path, "gguf")
    assert (scheme.scheme, scheme.weight_bits, scheme.quantized) == ("F16", None, False)


@pytest.fixture
def builds(tmp_path: Path) -> Path:
    """An F16 parent, a quantized parent, and a Q8_0 build, each in its own folder with its manifest."""
    for folder, file_type, kind in (("f16", "MOSTLY_F16", "F16"), ("q4", "MOSTLY_Q4_0", "Q4_0"),
                                    ("q8", "MOSTLY_Q8_0", "Q8_0")):  # fmt: skip
        (tmp_path / folder).mkdir()
        write_gguf(tmp_path / folder / f"m-{kind}.gguf", file_type, {"a": (kind, 2)})
    for name in ("f16", "q4"):
        (tmp_path / f"{name}.yaml").write_text(f"name: {name}\nweights: {{source: {name}, format: gguf}}\n")
        (tmp_path / f"from-{name}.yaml").write_text(
            f"name: q8\nweights: {{source: q8, format: gguf, derived_from: {name}.yaml}}\n"
        )
    return tmp_path


def test_an_f16_gguf_may_be_a_builds_parent(builds: Path) -> None:
    assert gguf_parent_problems(load_manifest(builds / "from-f16.yaml")) == []


def test_a_quantized_gguf_parent_is_refused_naming_its_type(builds: Path) -> None:
    problems = gguf_parent_problems(load_manifest(builds / "from-q4.yaml"))
    assert len(problems) == 1 and problems[0].startswith("weights.derived_from q4.yaml: its GGUF is Q4_0, already")
