"""aiperf 0.13 against `gate serve`, unmodified: streamed completions with its own tokenizer counts.

aiperf checks token counts against `usage` and output lengths against max_tokens; `ignore_eos` (served as
vLLM serves it) makes every output exactly as long as asked. Its tokenizer is the zoo model's folder, so
the *_OFFLINE variables must stay unset (aiperf 0.13 then tries a hub download of the path and fails).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from clients_harness import MODEL, GateServe, client_bin

pytestmark = pytest.mark.clients

REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 20, 32, 8


def test_aiperf_profile_completes_every_request(gate_serve: GateServe, tmp_path: Path) -> None:
    from servegate.zoo import zoo_model_path

    aiperf = client_bin("aiperf", "aiperf")
    command = [str(aiperf), "profile", "--model", MODEL, "--url", gate_serve.base_url, "--endpoint-type", "completions"]
    command += ["--streaming", "--tokenizer", str(zoo_model_path("tiny-primary"))]
    command += ["--request-count", str(REQUESTS), "--concurrency", "2", "--ui-type", "none"]
    command += ["--prompt-input-tokens-mean", str(PROMPT_TOKENS), "--prompt-input-tokens-stddev", "0"]
    command += ["--output-tokens-mean", str(OUTPUT_TOKENS), "--output-tokens-stddev", "0"]
    command += ["--extra-inputs", "ignore_eos:true", "--artifact-dir", str(tmp_path / "aiperf")]
    # Output lengths from our usage: past an EOS the text holds one token fewer than generated (EOS is no text).
    command += ["--use-server-token-count"]
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")} | {"HF_HOME": str(tmp_path / "hf")}
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "aiperf" / "profile_export_aiperf.json").read_text())
    assert report["is_complete"] and not report["was_cancelled"] and report["error_summary"] == []
    assert report["request_count"]["avg"] == REQUESTS
    assert report["output_sequence_length"]["avg"] == OUTPUT_TOKENS
