"""`gate verify` against servegate's own server: its /v1/models says the context, so a drifted max_model_len is
named by its field (not only by the fingerprint it changed)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from deploy_paths import ROOT
from support.drifting_remote import serve_app

from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.deploy.verify import verify_deployment

MANIFEST = """\
name: verify-gateway
weights: {source: "zoo:tiny-primary"}
preprocess: {chat_template: none, max_input_tokens: 64, truncation: reject, unknown_fields: reject}
runtime: {max_model_len: 128}
postprocess: {max_output_tokens: 32}
"""


@pytest.fixture(scope="module")
def drifted() -> Iterator[str]:
    """`gate serve`'s app for the manifest with max_model_len drifted to 160."""
    from servegate.server import create_app

    data = yaml.safe_load(MANIFEST)
    data["runtime"]["max_model_len"] = 160
    with serve_app(create_app(ServedModel.model_validate(data))) as url:
        yield url


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(MANIFEST)
    return path


def test_v1_models_publishes_max_model_len(drifted: str) -> None:
    [card] = httpx.get(drifted + "/v1/models").json()["data"]
    assert (card["id"], card["max_model_len"]) == ("verify-gateway", 160)


def test_a_drifted_max_model_len_is_named_by_its_field_and_in_the_fingerprint_check(
    drifted: str, manifest: Path
) -> None:
    report = verify_deployment(load_manifest(manifest), drifted)
    assert report.drift == ["fingerprint", "runtime.max_model_len"]
    checks = {c.name: c for c in report.checks}
    assert checks["runtime.max_model_len"].reason == "manifest 128, served 160"
    fingerprint = checks["fingerprint"].reason
    assert fingerprint.startswith("the gateway serves fingerprint ")
    assert fingerprint.endswith(": runtime.max_model_len: manifest 128, served 160")


def test_gate_verify_prints_the_field_that_changed(drifted: str, manifest: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "servegate.cli", "verify", str(manifest), "--url", drifted],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "COLUMNS": "240"}, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "manifest 128, served 160" in done.stdout and "DRIFT" in done.stdout


def test_the_gateway_of_this_very_manifest_matches(manifest: Path) -> None:
    from servegate.server import create_app

    served = load_manifest(manifest)
    with serve_app(create_app(served)) as url:
        report = verify_deployment(served, url)
    assert report.drift == []
    assert {c.name: c.verdict for c in report.checks}["runtime.max_model_len"] == "pass"
