"""GGUF builds made by llama.cpp's own tools, gated against their f16 parent on the reference runtime.

`make gguf-builds` makes them (scripts/build_gguf.py, with the tools `make llamacpp` built): the zoo model's
safetensors converted to an f16 GGUF by `convert_hf_to_gguf.py`, then `llama-quantize`d to Q8_0, Q5_K_M, Q4_K_M
and a planted bad Q2_K. The reference runtime dequantizes each file at load through transformers' GGUF reader, so
these gates measure the quantization alone (llama.cpp's own kernels are the engines group's business). Marked
`toolchain`: `make toolchain` builds and runs them; they skip, naming that command, when the builds are absent.

The suite is the one the llm-compressor builds are gated on (tests/toolchain/test_llmcompressor_builds.py): the
real example's extraction suite cut to 24 items, so three checks fit in a few minutes on 2 cores; the parent's
answers are computed once and read from the shared cache by the later checks. field_accuracy's margin is 0.15,
not their 0.2: the planted Q2_K build is mostly Q4_0 on this model (576-weight rows do not fill a K-quant's
super-blocks), and at 0.2 its interval's lower end (-0.215) fails by 0.015, which another CPU's answers could flip;
at 0.15 it fails by 0.065 and Q4_K_M (lower end -0.042) passes by 0.108. (At 0.1, 24 items are too few for the
exact test on json_schema_valid, which needs 36: Q8_0 warned. json_schema_valid keeps 0.2.)
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
BUILDS = ("f16", "q8_0", "q4_k_m", "q2_k")
SMALL_SUITES = """\
quality:
  suites:
    - {name: extraction, dataset: zoo:extraction, kind: extraction, limit: 24, max_tokens: 48, public: true}
  margins: {json_schema_valid: 0.2, field_accuracy: 0.15}
failure_policy:
  # items past a deadline leave the paired tests (a warning): on a loaded 2-core machine 10 of the 24 did at the
  # example's 300 s, which measures the machine, not the build
  request_timeout_s: 1800
"""

# Next-token agreement with the parent along its answers (434 positions), measured 2026-12-05 on the busy 2-core VM:
# Q8_0 0.982 (mean KL 0.0011 nats), Q4_K_M 0.869 (0.049), Q2_K 0.705 (0.484). The bounds leave room for another CPU.
AGREEMENT_Q8_0 = 0.95
AGREEMENT_Q4_K_M = 0.75
AGREEMENT_Q2_K = 0.8


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The f16 parent's and each build's manifest, cut to the small suite, in one folder with one output cache."""
    missing = [name for name in BUILDS if not (EXAMPLE / "gguf-builds" / name / "servegate-build.json").is_file()]
    if missing:
        pytest.skip(f"llama.cpp GGUF builds {', '.join(missing)} are absent: run `make gguf-builds`")
    here = tmp_path_factory.mktemp("gguf")
    (here / "small.yaml").write_text(SMALL_SUITES, encoding="utf-8")
    for name in BUILDS:
        (here / f"{name}.yaml").write_text(f"include: [{EXAMPLE}/gguf-{name}.yaml, small.yaml]\n", encoding="utf-8")
    return here


def check(folder: Path, name: str) -> tuple[int, dict[str, object], str]:
    """`gate check --baseline f16 --candidate NAME --gate quantization`: exit code, the gate's entry, output."""
    report = folder / f"{name}.json"
    done = subprocess.run(
        [sys.executable, "-m", "servegate.cli", "check", "--baseline", "f16.yaml", "--candidate", f"{name}.yaml",
         "--gate", "quantization", "--json", str(report)],
        capture_output=True, text=True, cwd=folder, timeout=1800,
        env={**os.environ, "SERVEGATE_CACHE": str(folder / "cache"), "COLUMNS": "200"},
    )  # fmt: skip
    if not report.is_file():
        pytest.fail(f"no report (exit {done.returncode}): {done.stderr[-2000:]}")
    gates = json.loads(report.read_text(encoding="utf-8"))["gates"]
    return done.returncode, next(g for g in gates if g["name"] == "quantization"), done.stdout + done.stderr


def test_the_q8_0_build_passes_with_its_toolchain_recorded(folder: Path) -> None:
    code, gate, output = check(folder, "q8_0")
    assert code == 0 and gate["verdict"] == "pass", output
    checkpoint = gate["measurements"]["checkpoint"]
    assert checkpoint["format"] == "gguf" and checkpoint["scheme"] == "Q8_0" and checkpoint["weight_bits"] == 8
    assert checkpoint["toolchain"].startswith("llama.cpp ")  # the tools' version, from servegate-build.json
    assert any("llama-quantize SmolLM2-135M-Instruct-F16.gguf" in note for note in checkpoint["notes"])
    agreement = gate["measurements"]["next_token"]["extraction"]["token_agreement"]
    assert agreement > AGREEMENT_Q8_0, agreement


def test_the_q4_k_m_build_is_measured_with_intervals(folder: Path) -> None:
    code, gate, output = check(folder, "q4_k_m")
    assert code in (0, 1), output
    measured = gate["measurements"]
    checkpoint = measured["checkpoint"]
    assert checkpoint["scheme"] == "Q4_K_M"
    # rows of 576 weights do not fill a K-quant's 256-weight super-blocks: most tensors hold the fallback Q5_0
    assert "Q4_K x" in checkpoint["storage"] and "Q5_0 x" in checkpoint["storage"]
    for metric in ("field_accuracy", "json_schema_valid"):
        figure = measured["suites"]["extraction"][metric]
        assert figure["lower"] <= figure["difference"] <= figure["upper"] and figure["n"] == 24
    assert measured["next_token"]["extraction"]["token_agreement"] > AGREEMENT_Q4_K_M


def test_the_planted_q2_k_build_is_blocked(folder: Path) -> None:
    code, gate, output = check(folder, "q2_k")
    # measured: field accuracy 0.507 -> 0.375, difference -0.132 [-0.215, -0.049] against the margin 0.15
    assert code == 1 and gate["verdict"] == "fail", output
    assert "gguf Q2_K" in gate["reason"]
    assert gate["measurements"]["next_token"]["extraction"]["token_agreement"] < AGREEMENT_Q2_K
