"""lm-eval tasks as quality suites: the zoo's tasks through servegate's engine, per sample, paired."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servegate.contracts.errors import ManifestError
from servegate.contracts.loading import load_manifest
from servegate.contracts.quality_section import LM_EVAL_INSTALL, Suite

BASE = """\
apiVersion: servegate/v1
kind: ServedModel
name: lm-eval-base
weights: {source: zoo:tiny-primary}
preprocess: {chat_template: none, max_input_tokens: 96, truncation: left}
runtime: {max_model_len: 128, kv_cache: {block_size: 16, memory_budget: 1MiB}}
batching: {mode: continuous, max_batch_size: 8}
postprocess: {max_output_tokens: 32, logprobs: true}
quality:
  suites:
    - {name: arith-lm, lm_eval: {task: zoo_arith, limit: LIMIT, include_path: zoo}, public: true}
    - {name: choice-lm, lm_eval: {task: zoo_arith_choice, limit: LIMIT, include_path: zoo}, public: true}
  margins: {exact_match: 0.05, acc: 0.05}
"""


def write_manifests(tmp_path: Path, limit: int) -> dict[str, Path]:
    """base.yaml plus int8.yaml and int2.yaml candidates over the zoo's lm-eval tasks."""
    paths = {"base": tmp_path / "base.yaml"}
    paths["base"].write_text(BASE.replace("LIMIT", str(limit)), encoding="utf-8")
    for method in ("int8", "int2"):
        paths[method] = tmp_path / f"{method}.yaml"
        paths[method].write_text(
            f"include: base.yaml\nname: lm-eval-{method}\nruntime: {{quantization: {{method: {method}-weight}}}}\n",
            encoding="utf-8",
        )
    return paths


# --- the manifest section (no lm-eval needed) ------------------------------------------------------


def test_a_missing_extra_gives_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # what `import lm_eval` sees when it is not installed
    with pytest.raises(ValueError, match=r"pip install 'servegate\[lm-eval\]'"):
        Suite.model_validate({"name": "gsm8k", "lm_eval": {"task": "gsm8k", "num_fewshot": 5}})
    paths = write_manifests(tmp_path, 10)
    with pytest.raises(ManifestError) as caught:
        load_manifest(paths["base"])
    assert LM_EVAL_INSTALL in str(caught.value) and "quality.suites" in str(caught.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"split": "calibration"}, "remove split"),
        ({"dataset": "zoo:arith"}, "remove dataset"),
        ({"max_tokens": 4, "prompt_field": "q"}, "remove prompt_field, max_tokens"),
        ({"limit": 3}, "give the limit once"),
    ],
)
def test_an_lm_eval_suite_refuses_the_fields_of_jsonl_suites(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Suite.model_validate({"name": "s", "lm_eval": {"task": "zoo_arith", "limit": 5}, **extra})


def test_a_suite_needs_a_dataset_or_a_task() -> None:
    with pytest.raises(ValueError, match="`dataset` .* or `lm_eval`"):
        Suite.model_validate({"name": "s"})


def test_an_lm_eval_suite_survives_a_dump_and_reload() -> None:
    pytest.importorskip("lm_eval")
    suite = Suite.model_validate({"name": "s", "lm_eval": {"task": "zoo_arith", "limit": 5, "include_path": "zoo"}})
    assert suite.dataset == "lm-eval:zoo_arith" and suite.item_limit == 5
    assert Suite.model_validate(suite.model_dump(mode="json")) == suite
