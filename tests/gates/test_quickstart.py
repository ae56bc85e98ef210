"""The quickstart examples on the real runtime and the zoo models: the manifest passes, each unsafe variant fails
in exactly its gate. One small run is in the default suite; the whole-example runs are marked slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "examples/quickstart"
UNSAFE = {
    "unsafe-quantization.yaml": "quantization",
    "unsafe-truncation.yaml": "truncation",
    "unsafe-cache.yaml": "caching",
    "unsafe-fallback.yaml": "fallback",
}


def _zoo_ready() -> bool:
    try:
        from servegate.zoo import zoo_model_path

        return all((zoo_model_path(n) / "model.safetensors").is_file() for n in ("tiny-primary", "tiny-fallback"))
    except Exception:
        return False


needs_zoo = pytest.mark.skipif(not _zoo_ready(), reason="the zoo models are not built")


def gate_check(manifest: Path, tmp_path: Path, *args: str) -> tuple[int, dict]:
    """`gate check` as CI runs it, in a fresh process with its own baseline cache."""
    report = tmp_path / f"{manifest.stem}.json"
    env = {**os.environ, "SERVEGATE_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "servegate.cli", "check", str(manifest), "--json", str(report), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return done.returncode, json.loads(report.read_text())


def _limits(n: int) -> list[str]:
    return [arg for i in range(3) for arg in ("--set", f"quality.suites.{i}.limit={n}")]


@needs_zoo
def test_unsafe_truncation_fails_in_the_truncation_gate_on_the_real_runtime(tmp_path: Path) -> None:
    code, report = gate_check(QUICKSTART / "unsafe-truncation.yaml", tmp_path, "--gate", "truncation", *_limits(40))
    (truncation,) = [g for g in report["gates"] if g["name"] == "truncation"]
    assert code == 1 and truncation["verdict"] == "fail", truncation["reason"]
    assert truncation["reason"].startswith("recall/exact_match")
    recall = truncation["measurements"]["per_suite"]["recall"]
    assert recall["share_over_limit"] == 1.0
    assert recall["over_limit_scores"]["full_context"] - recall["over_limit_scores"]["under_policy"] >= 0.3


@pytest.mark.slow
@needs_zoo
def test_the_quickstart_passes(tmp_path: Path) -> None:
    code, report = gate_check(QUICKSTART / "manifest.yaml", tmp_path)
    failed = {g["name"]: g["reason"] for g in report["gates"] if g["verdict"] == "fail"}
    assert code == 0 and not failed, failed


@pytest.mark.slow
@needs_zoo
@pytest.mark.parametrize(("name", "gate"), sorted(UNSAFE.items()))
def test_each_unsafe_variant_fails_in_exactly_its_gate(tmp_path: Path, name: str, gate: str) -> None:
    code, report = gate_check(QUICKSTART / name, tmp_path)
    failed = sorted(g["name"] for g in report["gates"] if g["verdict"] == "fail")
    assert code == 1 and failed == [gate], {g["name"]: g["reason"] for g in report["gates"]}
