"""Toolchain checkpoints gated against their parent: a compressed-tensors build names the model it was made from
(`weights.derived_from`), `gate check` compares the two on the suites, and what the files cannot run is refused
before any model loads (exit 2, one line naming the file and the fix)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkpoints import build_compressed

from servegate.zoo import zoo_model_path

PARENT = """\
apiVersion: servegate/v1
kind: ServedModel
name: parent
weights: {source: zoo:tiny-primary}
preprocess: {chat_template: none, max_input_tokens: 112}
runtime: {max_model_len: 128, threads: 1}
batching: {mode: dynamic, max_batch_size: 8}
postprocess: {max_output_tokens: 16}
quality:
  suites:
    - {name: arith, dataset: zoo:arith, limit: 80}
  margins: {exact_match: 0.05}
"""


def build(tmp: Path, name: str, **scheme: object) -> Path:
    """A compressed-tensors build of zoo:tiny-primary under `tmp`, once per session."""
    return build_compressed(Path(zoo_model_path("tiny-primary")), tmp / name, **scheme)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three builds of the same parent: int8 per channel, int8 weights with int8 activations, int2 in groups of 16."""
    tmp = tmp_path_factory.mktemp("builds")
    return {
        "w8": build(tmp, "w8", bits=8),
        "w8a8": build(tmp, "w8a8", bits=8, activations=True),
        "w2": build(tmp, "w2", bits=2, group_size=16),
    }


@pytest.fixture
def folder(tmp_path: Path, builds: dict[str, Path]) -> Path:
    """A folder with the parent manifest and one derived manifest per build."""
    (tmp_path / "parent.yaml").write_text(PARENT, encoding="utf-8")
    for name, path in builds.items():
        (tmp_path / f"{name}.yaml").write_text(
            f"include: parent.yaml\nname: {name}\n"
            f"weights: {{source: {path}, format: compressed-tensors, derived_from: parent.yaml}}\n",
            encoding="utf-8",
        )
    return tmp_path


def gate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real `gate` command in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "servegate.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def quantization(report: Path) -> dict[str, object]:
    """The quantization gate's entry of a JSON report."""
    gates = json.loads(report.read_text(encoding="utf-8"))["gates"]
    return next(g for g in gates if g["name"] == "quantization")


def test_a_good_build_passes_and_the_report_carries_its_scheme(folder: Path) -> None:
    done = gate("check", "w8.yaml", "--gate", "quantization", "--json", "r.json", cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    result = quantization(folder / "r.json")
    measured = result["measurements"]
    assert result["verdict"] == "pass"
    assert measured["method"] == "compressed-tensors W8A16" and measured["parent"] == "zoo:tiny-primary"
    checkpoint = measured["checkpoint"]
    assert (
        checkpoint["scheme"] == "W8A16" and checkpoint["strategy"] == "channel" and checkpoint["ignored"] == ["lm_head"]
    )
    assert "dequantized once at load" in checkpoint["executed_as"]
    agreement = measured["next_token"]["arith"]["token_agreement"]
    assert agreement > 0.9, agreement


def test_a_two_bit_build_fails_the_quantization_gate(folder: Path) -> None:
    done = gate("check", "w2.yaml", "--gate", "quantization", "--json", "r.json", cwd=folder)
    assert done.returncode == 1, done.stdout + done.stderr
    result = quantization(folder / "r.json")
    assert result["verdict"] == "fail" and "compressed-tensors W2A16 against zoo:tiny-primary" in result["reason"]
    assert result["measurements"]["checkpoint"]["group_size"] == 16


def test_activations_of_a_w8a8_build_are_rounded_per_token(folder: Path, builds: dict[str, Path]) -> None:
    import torch

    from servegate.contracts.loading import load_manifest
    from servegate.runtime.model.weights import load_causal_lm

    with_acts = load_causal_lm(load_manifest(folder / "w8a8.yaml")).model
    weights_only = load_causal_lm(load_manifest(folder / "w8.yaml")).model
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.no_grad():
        differ = (with_acts(ids).logits - weights_only(ids).logits).abs().max().item()
    assert differ > 1e-4  # the same int8 weights: only the int8 activations can move the logits
    hooked = [m for m in with_acts.modules() if isinstance(m, torch.nn.Linear) and m._forward_pre_hooks]
    assert len(hooked) == 14  # 2 layers x 7 projections; lm_head is in the ignore list


def test_the_single_manifest_form_compares_with_the_parent(folder: Path) -> None:
    from servegate.contracts.diff import diff_manifests
    from servegate.contracts.loading import load_manifest

    served = load_manifest(folder / "w2.yaml")
    reference = served.reference_form()
    assert reference.weights.source == "zoo:tiny-primary" and reference.weights.format == "safetensors"
    changed = {c.path for c in diff_manifests(reference, served)}
    assert {"weights.source", "weights.format", "weights.derived_from"} <= changed


def test_a_parent_with_another_architecture_is_refused_before_any_model_loads(folder: Path) -> None:
    (folder / "other.yaml").write_text(PARENT.replace("zoo:tiny-primary", "zoo:tiny-fallback"), encoding="utf-8")
    (folder / "mismatch.yaml").write_text(
        (folder / "w8.yaml")
        .read_text(encoding="utf-8")
        .replace("derived_from: parent.yaml", "derived_from: other.yaml"),
        encoding="utf-8",
    )
    done = gate("check", "mismatch.yaml", cwd=folder)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "but the parent's is" in done.stderr and "weights.derived_from" in done.stderr
    assert "contract" not in done.stdout  # no gate ran


def test_a_scheme_the_runtime_cannot_run_is_one_line_and_exit_2(folder: Path, builds: dict[str, Path]) -> None:
    import shutil

    broken = folder / "nvfp4"
    shutil.copytree(builds["w8"], broken)
    config = json.loads((broken / "config.json").read_text(encoding="utf-8"))
    config["quantization_config"]["format"] = "nvfp4-pack-quantized"
    for group in config["quantization_config"]["config_groups"].values():
        group["format"] = "nvfp4-pack-quantized"
    (broken / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "nvfp4.yaml").write_text(
        f"include: parent.yaml\nweights: {{source: {broken}, format: compressed-tensors, derived_from: parent.yaml}}\n",
        encoding="utf-8",
    )
    done = gate("check", "nvfp4.yaml", cwd=folder)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "nvfp4-pack-quantized is not one servegate's runtime can run" in done.stderr
    assert str(broken / "config.json") in done.stderr


def test_a_plain_folder_declared_compressed_tensors_is_refused(folder: Path) -> None:
    plain = zoo_model_path("tiny-primary")
    (folder / "plain.yaml").write_text(
        f"include: parent.yaml\nweights: {{source: {plain}, format: compressed-tensors, derived_from: parent.yaml}}\n",
        encoding="utf-8",
    )
    done = gate("check", "plain.yaml", cwd=folder)
    assert done.returncode == 2
    assert "its quantization_config is absent" in done.stderr


def test_manifest_rules_for_checkpoints(folder: Path) -> None:
    from servegate.contracts.loading import load_manifest

    cases = {
        "runtime: {quantization: {method: int8-weight}}": "would quantize it again",
        "weights: {gguf_file: model.gguf}": "set format: gguf",
        "weights: {derived_from: missing.yaml}": "is not a file",
    }
    for extra, message in cases.items():
        path = folder / "case.yaml"
        path.write_text(f"include: w8.yaml\n{extra}\n", encoding="utf-8")
        with pytest.raises(Exception) as caught:
            load_manifest(path).reference_form()
        assert message in str(caught.value), (extra, caught.value)


def test_the_notes_model_identity_says_what_made_the_build_and_its_parent(folder: Path) -> None:
    from servegate.contracts.loading import load_manifest
    from servegate.model_cards.items_contract import model_identity
    from servegate.model_cards.render_markdown import _identity

    path = folder / "w4-note.yaml"
    path.write_text("include: w2.yaml\ncard: {public_name: tiny-w2, license: Apache-2.0}\n", encoding="utf-8")
    item = model_identity(load_manifest(path))
    checkpoint = item["weights_checkpoint"]
    assert checkpoint["scheme"] == "W2A16" and checkpoint["group_size"] == 16
    assert checkpoint["derived_from"] == "zoo:tiny-primary"  # the parent's public source, not a local path
    text = "\n".join(_identity(item, "#"))
    assert "Quantized checkpoint: compressed-tensors W2A16, groups of 16 weights" in text
    assert "gated against its parent `zoo:tiny-primary`" in text
    assert item["weights_source"] == "local checkpoint (path not published)"
