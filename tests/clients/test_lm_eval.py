"""lm-eval 0.4.13 `local-completions` with its defaults against `gate serve`, unmodified.

Its defaults: the remote tokenizer (`tokenizer_backend=auto` finds /tokenizer_info and /tokenize), token-id
prompts (`[[ids], ...]`), several prompts per request (`--batch_size 4`). The task is the zoo's arithmetic
suite; lm-eval's exact_match must equal the one measured by asking the server the same token ids directly.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from clients_harness import MODEL, ROOT, GateServe, client_bin

pytestmark = pytest.mark.clients

ITEMS = 40
TASK = """task: zoo_arith
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{reference}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
metric_list:
  - metric: exact_match
"""


def _direct_exact_match(server: GateServe, items: list[dict[str, str]]) -> float:
    """The same items sent as lm-eval sends them (token ids without special tokens), one at a time."""
    hits = 0
    for item in items:
        ids = httpx.post(f"{server.base_url}/tokenize", json={"prompt": item["prompt"], "add_special_tokens": False})
        body = {"model": MODEL, "prompt": ids.json()["tokens"], "max_tokens": 8, "temperature": 0, "stop": ["\n"]}
        answer = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
        hits += answer["choices"][0]["text"] == item["reference"]
    return hits / len(items)


def test_lm_eval_defaults_score_what_the_server_answers(gate_serve: GateServe, tmp_path: Path) -> None:
    lm_eval = client_bin("lm-eval", "lm_eval")
    lines = (ROOT / "servegate/zoo/suites/arith.test.jsonl").read_text(encoding="utf-8").splitlines()[:ITEMS]
    items = [json.loads(line) for line in lines]
    data = tmp_path / "arith.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "zoo_arith.yaml").write_text(TASK.format(data=data), encoding="utf-8")
    args = {"model": MODEL, "base_url": f"{gate_serve.base_url}/v1/completions", "num_concurrent": 2}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    command = [str(lm_eval), "--model", "local-completions", "--model_args", json.dumps(args)]
    command += ["--include_path", str(tmp_path), "--tasks", "zoo_arith", "--batch_size", "4"]
    command += ["--output_path", str(tmp_path / "out")]
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Using remote tokenizer" in run.stderr  # the default backend found /tokenizer_info and /tokenize
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    score = results["results"]["zoo_arith"]["exact_match,none"]
    assert score == pytest.approx(_direct_exact_match(gate_serve, items))
    assert score > 0.5  # the zoo model does its arithmetic: not a chance-level run
