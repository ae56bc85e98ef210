"""`gate export --target llamacpp`: llama-server's command line and its residuals; `gate validate` of a llamacpp
manifest llama.cpp cannot serve as declared. No llama-server needed (tests/engines/ start the real one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from servegate.contracts.loading import load_manifest
from servegate.deploy.llamacpp_export import SCRIPT, TEMPLATE_FILE
from servegate.deploy.targets import Deployment, export_manifest, write_export

ROOT = Path(__file__).parents[2]
MANIFEST = """name: smol-llamacpp
weights: {source: zoo:tiny-primary, format: gguf, gguf_file: m.gguf}
preprocess: {max_input_tokens: 96, truncation: left, chat_template: chat.jinja}
runtime:
  backend: llamacpp
  device: cpu
  dtype: float32
  max_model_len: 256
  threads: 2
  kv_cache: {memory_budget: 64MiB}
  warmup: [{prompt: "1+1=", expect: "2", max_tokens: 2}]
batching: {mode: continuous, max_batch_size: 2, max_num_batched_tokens: 256}
postprocess: {max_output_tokens: 32}
"""


def gate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real console entry point in a subprocess."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "servegate.cli", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120
    )


def _manifest(tmp_path: Path, text: str = MANIFEST) -> Path:
    (tmp_path / "chat.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    return path


def test_the_export_is_a_start_script_with_the_mapped_flags_and_its_residuals(tmp_path: Path) -> None:
    served = load_manifest(_manifest(tmp_path))
    plan = export_manifest(served, "llamacpp", Deployment(model="/models/m.gguf"))
    script = plan.files[SCRIPT]
    assert script.startswith("#!/bin/sh") and 'exec "${LLAMA_SERVER:-llama-server}"' in script
    for flag in (
        "--model /models/m.gguf",
        "--alias smol-llamacpp",
        "--parallel 2",
        "--ctx-size 512",
        "--batch-size 256",
        "--no-cache-prompt",
        "--threads 2",
        "--repeat-penalty 1.0",
        "--top-k 0",
    ):
        assert f"  {flag} \\" in script, flag
    assert f'--chat-template-file "$here/{TEMPLATE_FILE}"' in script  # the copy beside it: the export stands alone
    assert plan.files[TEMPLATE_FILE] == (tmp_path / "chat.jinja").read_text()
    residuals = {r["field"]: r for r in json.loads(plan.files["residual.json"])["residuals"]}
    assert residuals["preprocess.truncation"]["enforced_by"] == "gateway"
    assert "llama-server" in residuals["preprocess.truncation"]["reason"] and "vLLM" not in json.dumps(residuals)
    assert residuals["runtime.warmup"]["enforced_by"] == "readiness_probe"
    assert not plan.behaviour_changes
    again = export_manifest(load_manifest(tmp_path / "manifest.yaml"), "llamacpp", Deployment(model="/models/m.gguf"))
    assert again.files == plan.files  # deterministic, like every export
    written = write_export(plan, tmp_path / "out")
    assert os.access(tmp_path / "out" / SCRIPT, os.X_OK) and len(written) == len(plan.files)


def test_a_behaviour_change_is_listed_and_strict_refuses_it(tmp_path: Path) -> None:
    path = _manifest(tmp_path, MANIFEST.replace("mode: continuous", "mode: dynamic"))
    plan = export_manifest(load_manifest(path), "llamacpp", Deployment(model="/models/m.gguf"))
    assert [r.field for r in plan.behaviour_changes] == ["batching.mode"]
    result = gate(
        "export",
        str(path),
        "--target",
        "llamacpp",
        "--model",
        "/m.gguf",
        "--strict",
        "-o",
        str(tmp_path / "out"),
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "batching.mode" in result.stdout and not (tmp_path / "out").exists()


def test_validate_refuses_what_llamacpp_would_serve_differently_naming_the_field(tmp_path: Path) -> None:
    path = _manifest(tmp_path, MANIFEST.replace("format: gguf, gguf_file: m.gguf", "format: safetensors"))
    result = gate("validate", str(path), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot serve weights.format" in result.stderr + result.stdout and "GGUF files only" in (
        result.stderr + result.stdout
    )
