"""Checkpoints made by a real toolchain, gated against their parent on the reference runtime.

`make checkpoints` builds them with llm-compressor in its own venv (scripts/build_checkpoints.py, on
zoo:smollm2-135m-instruct with examples/smollm2/calibration.jsonl): a W8A8 build (round to nearest), a GPTQ
W4A16 build in groups of 64, and a planted bad build (2-bit weights). Marked `toolchain`: `make toolchain` builds
and runs them; they skip, naming that command, when the builds are absent.

The suite is the real example's extraction suite cut to 24 items (field accuracy separates the bad build at a
0.2 margin with n=24; json_schema_valid needs n >= 17 there), so three checks fit in a few minutes on 2 cores;
the parent's answers are computed once and read from the shared cache by the later checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.toolchain

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2"
BUILDS = ("w8a8", "w4a16", "w2a16-bad")
SMALL_SUITES = """\
quality:
  suites:
    - {name: extraction, dataset: zoo:extraction, kind: extraction, limit: 24, max_tokens: 48, public: true}
  margins: {json_schema_valid: 0.2, field_accuracy: 0.2}
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The parent and each build's manifest, cut to the small suite, in one folder with one output cache."""
    missing = [name for name in BUILDS if not (EXAMPLE / "checkpoints" / name / "servegate-build.json").is_file()]
    if missing:
        pytest.skip(f"llm-compressor builds {', '.join(missing)} are absent: run `make checkpoints`")
    from servegate.zoo import ZooError, zoo_model_path

    try:
        zoo_model_path("smollm2-135m-instruct")
    except ZooError:
        pytest.skip("zoo:smollm2-135m-instruct is not fetched: run `make fetch`")
    here = tmp_path_factory.mktemp("toolchain")
    (here / "small.yaml").write_text(SMALL_SUITES, encoding="utf-8")
    for name in ("manifest", *BUILDS):
        (here / f"{name}.yaml").write_text(f"include: [{EXAMPLE / name}.yaml, small.yaml]\n", encoding="utf-8")
    return here


def check(folder: Path, name: str) -> tuple[int, dict[str, object], str]:
    """`gate check --baseline parent --candidate NAME --gate quantization`: exit code, the gate's entry, output."""
    report = folder / f"{name}.json"
    done = subprocess.run(
        [sys.executable, "-m", "servegate.cli", "check", "--baseline", "manifest.yaml", "--candidate", f"{name}.yaml",
         "--gate", "quantization", "--json", str(report)],
        capture_output=True, text=True, cwd=folder, timeout=1800,
        env={**os.environ, "SERVEGATE_CACHE": str(folder / "cache"), "COLUMNS": "200"},
    )  # fmt: skip
    if not report.is_file():
        pytest.fail(f"no report (exit {done.returncode}): {done.stderr[-2000:]}")
    gates = json.loads(report.read_text(encoding="utf-8"))["gates"]
    return done.returncode, next(g for g in gates if g["name"] == "quantization"), done.stdout + done.stderr


def test_the_w8a8_build_passes_with_its_toolchain_recorded(folder: Path) -> None:
    code, gate, output = check(folder, "w8a8")
    assert code == 0 and gate["verdict"] == "pass", output
    checkpoint = gate["measurements"]["checkpoint"]
    assert checkpoint["scheme"] == "W8A8" and checkpoint["activations"] == "int8 dynamic per token"
    assert checkpoint["toolchain"].startswith("llm-compressor ")
    assert "QuantizationModifier" in checkpoint["recipe"] and checkpoint["calibration"] is None  # round to nearest
    agreement = gate["measurements"]["next_token"]["extraction"]["token_agreement"]
    assert agreement > 0.8, agreement  # measured 0.887 (mean KL 0.035 nats): int8 activations move some tokens


def test_the_w4a16_build_is_measured_with_intervals(folder: Path) -> None:
    code, gate, output = check(folder, "w4a16")
    assert code in (0, 1), output
    measured = gate["measurements"]
    assert measured["checkpoint"]["scheme"] == "W4A16" and measured["checkpoint"]["group_size"] == 64
    calibration = measured["checkpoint"]["calibration"]  # GPTQ: the set it was calibrated on, from the build record
    assert calibration["file"] == "calibration.jsonl" and calibration["samples"] > 0
    assert len(calibration["sha256"]) == 64
    assert "GPTQModifier" in measured["checkpoint"]["recipe"]
    accuracy = measured["suites"]["extraction"]["field_accuracy"]
    assert accuracy["lower"] <= accuracy["difference"] <= accuracy["upper"] and accuracy["n"] == 24
    assert measured["next_token"]["extraction"]["token_agreement"] > 0.6  # measured 0.779: most tokens still agree


def test_the_planted_two_bit_build_is_blocked(folder: Path) -> None:
    code, gate, output = check(folder, "w2a16-bad")
    assert code == 1 and gate["verdict"] == "fail", output
    assert "compressed-tensors W2A16" in gate["reason"]
    assert gate["measurements"]["next_token"]["extraction"]["token_agreement"] < 0.5  # measured 0.0
