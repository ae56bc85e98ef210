"""`zoo:facts` and `zoo:format` on the model they were written for: SmolLM2-135M-Instruct behind
examples/tools/chatml-tools.jinja (`make fetch`; skipped when it is not fetched) answers the first 8 items of each
well above zero through `gate eval`, as plain chat requests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.manifests import real_manifest, write_manifest

from servegate.cli.app import main
from servegate.zoo import ZooError, zoo_model_path

NAME = "smollm2-135m-instruct"
TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "tools" / "chatml-tools.jinja"


def test_smollm2_answers_facts_and_follows_formats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        zoo_model_path(NAME)
    except ZooError:
        pytest.skip(f"zoo:{NAME} is not fetched: run `make fetch`")
    manifest = real_manifest(
        f"zoo:{NAME}",
        preprocess={"chat_template": str(TEMPLATE), "max_input_tokens": 512, "max_payload_bytes": 16384},
        runtime={"max_model_len": 640, "threads": 2, "kv_cache": {"block_size": 16, "memory_budget": "64MiB"}},
        batching={"max_num_batched_tokens": 640},
        postprocess={"max_output_tokens": 32},
    )
    manifest["quality"] = {"suites": [
        {"name": "facts", "dataset": "zoo:facts", "kind": "chat", "limit": 8, "max_tokens": 24, "public": True},
        {"name": "format", "dataset": "zoo:format", "kind": "chat", "metrics": ["format_followed"], "limit": 8,
         "max_tokens": 24, "public": True},
    ]}  # fmt: skip
    path = write_manifest(tmp_path, manifest)
    report = tmp_path / "eval.json"
    monkeypatch.setenv("SERVEGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", ["gate", "eval", str(path), "--json", str(report)])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 0, capsys.readouterr().err
    suites = json.loads(report.read_text())["suites"]
    assert suites["facts"]["metrics"]["contains_answer"]["score"] > 0.25, suites["facts"]
    assert suites["format"]["metrics"]["format_followed"]["score"] > 0.25, suites["format"]
