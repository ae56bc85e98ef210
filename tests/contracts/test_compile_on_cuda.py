"""`runtime.compile: decode` is CPU-only: a manifest that asks for it on `device: cuda` is refused when it is
validated, with the line and what to change, before any model is loaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from servegate.contracts.sections import Runtime

ROOT = Path(__file__).parents[2]


def test_compile_decode_with_device_cuda_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="compile: decode is implemented for CPU only .* set compile: off"):
        Runtime.model_validate({"compile": "decode", "device": "cuda"})


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_compile_decode_stays_valid_on_cpu_and_auto(device: str) -> None:
    assert Runtime.model_validate({"compile": "decode", "device": device}).compile == "decode"


def test_gate_validate_names_the_line_and_the_fix(tmp_path: Path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "apiVersion: servegate/v1\nkind: ServedModel\nname: t\nweights: {source: zoo:tiny-primary}\n"
        "runtime:\n  device: cuda\n  compile: decode\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "servegate.cli", "validate", str(manifest)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"{manifest}:5:1: runtime: compile: decode is implemented for CPU only" in done.stderr
    assert "set compile: off" in done.stderr
