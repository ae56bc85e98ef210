"""`gate verify` against a fake OpenAI-compatible engine: one that matches, and one drifting in each checked way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest
from deploy_paths import ROOT
from support.fake_deployment import EngineState, fake_engine

from servegate.contracts.errors import ServegateError
from servegate.contracts.loading import load_manifest
from servegate.deploy.deployment_facts import expected_kv_blocks
from servegate.deploy.verify import verify_deployment
from servegate.runtime.remote.server_process import free_port

MANIFEST = """\
name: verify-me
weights: {source: "zoo:tiny-primary", dtype: float32}
preprocess: {max_input_tokens: 64, truncation: reject, unknown_fields: reject}
runtime:
  device: cpu
  dtype: float32
  max_model_len: 128
  kv_cache: {block_size: 16, memory_budget: 64MiB, prefix_caching: true}
  warmup: [{prompt: "12+34=", expect: "46", max_tokens: 4}]
batching: {mode: continuous, max_num_batched_tokens: 1024}
postprocess: {max_output_tokens: 32}
"""


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "verify.yaml"
    path.write_text(MANIFEST)
    return path


def test_the_kv_blocks_the_budget_buys_are_vllms() -> None:
    # vLLM 0.32 CPU gave zoo:tiny-primary 699,008 tokens per GiB (1,536 B/token, EXTERNAL_TOOLS.md): 64 MiB -> 2730
    import yaml

    from servegate.contracts.manifest import ServedModel

    assert expected_kv_blocks(ServedModel.model_validate(yaml.safe_load(MANIFEST))) == 2730


def test_a_matching_deployment_passes(manifest: Path) -> None:
    with fake_engine(EngineState()) as url:
        report = verify_deployment(load_manifest(manifest), url + "/v1", engine_version="0.32.0")
    assert report.drift == [] and report.verdict == "pass"
    verdicts = {c.name: c.verdict for c in report.checks}
    assert verdicts == {
        "fingerprint": "skipped",  # no servegate gateway in front
        "name": "pass",
        "runtime.max_model_len": "pass",
        "runtime.engine.name": "skipped",  # reported vllm; the manifest declares no engine
        "runtime.engine.version": "pass",
        "runtime.kv_cache.block_size": "pass",
        "runtime.kv_cache.dtype": "pass",
        "runtime.kv_cache.prefix_caching": "pass",
        "runtime.kv_cache.memory_budget": "pass",
        "runtime.warmup[0].expect": "pass",
        "preprocess.unknown_fields": "pass",
        "preprocess.truncation": "pass",
    }


DRIFTS = {
    "model id": ({"model_id": "someone-else"}, ["name"]),
    "max_model_len": ({"max_model_len": 4096}, ["runtime.max_model_len"]),
    "engine version": ({"version": "0.31.1"}, ["runtime.engine.version"]),
    "block size": ({"cache": {**EngineState().cache, "block_size": "32"}}, ["runtime.kv_cache.block_size"]),
    "cache dtype": ({"cache": {**EngineState().cache, "cache_dtype": "fp8_e4m3"}}, ["runtime.kv_cache.dtype"]),
    "prefix caching": (
        {"cache": {**EngineState().cache, "enable_prefix_caching": "False"}},
        ["runtime.kv_cache.prefix_caching"],
    ),
    "KV blocks": (
        {"cache": {**EngineState().cache, "kv_cache_memory_bytes": "None", "num_gpu_blocks": "5461"}},
        ["runtime.kv_cache.memory_budget"],
    ),
    "warm-up output": ({"completions": {"12+34=": "47"}}, ["runtime.warmup[0].expect"]),
    "unknown field accepted": ({"unknown_field_status": 200}, ["preprocess.unknown_fields"]),
    "over-long prompt accepted": ({"long_prompt_status": 200}, ["preprocess.truncation"]),
}


@pytest.mark.parametrize("case", sorted(DRIFTS))
def test_each_drift_is_named_by_its_manifest_field(case: str, manifest: Path) -> None:
    changes, fields = DRIFTS[case]
    with fake_engine(replace(EngineState(), **changes)) as url:
        report = verify_deployment(load_manifest(manifest), url, engine_version="0.32.0")
    assert report.drift == fields
    failed = next(c for c in report.checks if c.name == fields[0])
    assert failed.measurements.declared != failed.measurements.observed


def test_a_gateway_must_serve_this_manifest(manifest: Path) -> None:
    served = load_manifest(manifest)
    with fake_engine(replace(EngineState(), ready_fingerprint=served.fingerprint)) as url:
        assert verify_deployment(served, url, engine_version="0.32.0").drift == []
    with fake_engine(replace(EngineState(), ready_fingerprint="0" * 64)) as url:
        assert verify_deployment(served, url, engine_version="0.32.0").drift == ["fingerprint"]


def test_declared_truncation_changes_the_expected_status(manifest: Path) -> None:
    served = load_manifest(manifest, ["preprocess.truncation=left", "preprocess.unknown_fields=ignore"])
    with fake_engine(EngineState()) as url:  # a bare engine refuses both: the gateway is missing
        report = verify_deployment(served, url)
    assert report.drift == ["preprocess.unknown_fields", "preprocess.truncation"]


def test_an_unreachable_url_is_a_usage_error(manifest: Path) -> None:
    port = free_port()  # a port nobody listens on
    with pytest.raises(ServegateError, match="cannot reach"):
        verify_deployment(load_manifest(manifest), f"http://127.0.0.1:{port}", timeout_s=2)


def gate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servegate.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=120,
    )


def test_cli_exit_codes_json_and_junit(manifest: Path, tmp_path: Path) -> None:
    with fake_engine(EngineState()) as url:
        ok = gate("verify", str(manifest), "--url", url, "--engine-version", "0.32.0", "--json", "-")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["verdict"] == "pass" and "MATCH" in ok.stderr
    with fake_engine(replace(EngineState(), version="0.33.0", completions={})) as url:
        junit = tmp_path / "verify.xml"
        drift = gate("verify", str(manifest), "--url", url, "--engine-version", "0.32.0", "--junit", str(junit))
    assert drift.returncode == 1 and "DRIFT" in drift.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "gate verify verify-me" and suite.get("failures") == "2"
    failed = sorted(c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None)
    assert failed == ["runtime.engine.version", "runtime.warmup[0].expect"]
    port = free_port()  # a port nobody listens on
    down = gate("verify", str(manifest), "--url", f"http://127.0.0.1:{port}", "--timeout", "2")
    assert down.returncode == 2 and "cannot reach" in down.stderr
