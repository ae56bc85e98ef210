"""llm-compressor's builds served by vLLM's CPU build, gated against the float32 parent on the reference runtime.

vLLM 0.32's CPU kernels run compressed-tensors checkpoints in bfloat16 only, so the candidate declares
`runtime.dtype: bfloat16` (a float32 one is refused at `gate validate`, tests/runtime/test_vllm_mapping.py). Needs
`make checkpoints` and `make vllm-venv`; marked `toolchain` and run by `make toolchain`, skipped without either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servegate.runtime.remote.vllm_process import find_vllm_python

pytestmark = pytest.mark.toolchain

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "smollm2"
SMALL_SUITES = """\
quality:
  suites:
    - {name: extraction, dataset: zoo:extraction, kind: extraction, limit: 24, max_tokens: 48, public: true}
  margins: {json_schema_valid: 0.2, field_accuracy: 0.2}
"""


@pytest.mark.parametrize("build", ["w8a8", "w4a16"])
def test_vllm_serves_the_build_and_it_is_gated_against_the_parent(build: str, tmp_path: Path) -> None:
    if not (EXAMPLE / "checkpoints" / build / "servegate-build.json").is_file():
        pytest.skip(f"the llm-compressor build {build} is absent: run `make checkpoints`")
    python = find_vllm_python(REPO)
    if python is None:
        pytest.skip("no vLLM interpreter: run `make vllm-venv`")
    (tmp_path / "small.yaml").write_text(SMALL_SUITES, encoding="utf-8")
    (tmp_path / "parent.yaml").write_text(f"include: [{EXAMPLE}/manifest.yaml, small.yaml]\n", encoding="utf-8")
    (tmp_path / "vllm.yaml").write_text(
        f"include: [{EXAMPLE}/{build}.yaml, small.yaml]\n"
        "runtime:\n  backend: vllm\n  dtype: bfloat16\n  device: cpu\n"
        "  kv_cache: {block_size: 32, memory_budget: 256MiB}\n"
        f"  vllm: {{python: {python}, log_dir: {tmp_path / 'logs'}, startup_timeout_s: 900}}\n"
        "weights: {dtype: auto}\n",
        encoding="utf-8",
    )
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "servegate.cli", "check", "--baseline", "parent.yaml", "--candidate", "vllm.yaml",
         "--gate", "quantization", "--json", str(report)],
        capture_output=True, text=True, cwd=tmp_path, timeout=2400,
        env={**os.environ, "SERVEGATE_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"},
    )  # fmt: skip
    output = done.stdout + done.stderr + "\n".join(p.read_text()[-3000:] for p in (tmp_path / "logs").glob("*.log"))
    assert report.is_file(), output
    gate = next(g for g in json.loads(report.read_text())["gates"] if g["name"] == "quantization")
    measured = gate["measurements"]
    assert "vllm" in measured.get("ran_on", ""), output
    assert measured["checkpoint"]["scheme"] == {"w8a8": "W8A8", "w4a16": "W4A16"}[build]
    accuracy = measured["suites"]["extraction"]["field_accuracy"]
    assert accuracy["n"] == 24 and accuracy["lower"] <= accuracy["difference"] <= accuracy["upper"]
    if build == "w8a8":  # the good build: non-inferior to its parent at the declared margins
        assert done.returncode == 0 and gate["verdict"] == "pass", output
