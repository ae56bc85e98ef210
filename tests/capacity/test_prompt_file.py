"""`gate bench --prompts FILE.jsonl`: the exact prompts, in order, every run; `--arrival constant`: evenly spaced."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError
from support.synthetic_server import Delays, SyntheticServer

from servegate.capacity.bench.prompt_file import load_prompt_file, with_prompts
from servegate.capacity.bench.workload import make_requests
from servegate.contracts.capacity_section import Workload
from servegate.contracts.errors import ServegateError

ROWS = [
    {"prompt": "the first prompt", "max_tokens": 3},
    {"prompt": "a second, longer prompt of the file", "output_tokens_count": 5},  # guidellm's column name
    {"prompt": "third", "max_tokens": 2},
]


def gate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servegate.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", "SERVEGATE_HOME": str(cwd)},
        timeout=300,
    )


def write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_bench_sends_the_files_prompts_exactly_and_in_order_every_run(tmp_path: Path) -> None:
    prompts = write(tmp_path / "prompts.jsonl", ROWS)
    with SyntheticServer(Delays(ttft_ms=2, itl_ms=1)) as server:
        done = gate("bench", "--url", server.url, "--prompts", str(prompts), "--rate", "40", "--arrival", "constant",
                    "--repeats", "2", "--records", "records.jsonl", "--json", "bench.json", cwd=tmp_path)  # fmt: skip
        seen = list(server.prompts)
    assert done.returncode == 0, done.stdout + done.stderr
    assert seen[1:] == [r["prompt"] for r in ROWS] * 2  # after the probe: the file, twice, in order
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert [r["requested_output_tokens"] for r in records] == [3, 5, 2] * 2
    assert [r["usage_output_tokens"] for r in records] == [3, 5, 2] * 2
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["workload"]["arrival"] == "constant" and report["workload"]["num_requests"] == 3
    assert report["requests"]["completed"] == 3 * 2


def test_a_shorter_run_takes_the_first_prompts_and_a_longer_one_is_refused(tmp_path: Path) -> None:
    prompts = write(tmp_path / "prompts.jsonl", ROWS)
    with SyntheticServer(Delays(ttft_ms=1, itl_ms=1)) as server:
        two = gate("bench", "--url", server.url, "--prompts", str(prompts), "--rate", "40", "--requests", "2",
                   cwd=tmp_path)  # fmt: skip
        seen = list(server.prompts)
        four = gate("bench", "--url", server.url, "--prompts", str(prompts), "--rate", "40", "--requests", "4",
                    cwd=tmp_path)  # fmt: skip
    assert two.returncode == 0, two.stderr
    assert seen[1:] == [ROWS[0]["prompt"], ROWS[1]["prompt"]]
    assert four.returncode == 2 and "the prompt file holds 3 prompts; a run of 4 requests" in four.stderr


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("not json", "not JSON"),
        (json.dumps({"text": "no prompt key", "max_tokens": 3}), "a non-empty prompt"),
        (json.dumps({"prompt": "no length"}), "give max_tokens as a whole number >= 1 (got None)"),
        (json.dumps({"prompt": "zero", "max_tokens": 0}), "(got 0)"),
    ],
)
def test_a_bad_line_is_named_with_its_number(tmp_path: Path, line: str, said: str) -> None:
    path = write(tmp_path / "p.jsonl", [ROWS[0], line])
    with pytest.raises(ServegateError, match=f"p.jsonl:2: .*{re.escape(said)}"):
        load_prompt_file(path)


def test_usage_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    empty = write(tmp_path / "empty.jsonl", [""])
    url = "http://127.0.0.1:9/v1"
    no_prompt = gate("bench", "--url", url, "--prompts", str(empty), "--rate", "5", cwd=tmp_path)
    assert no_prompt.returncode == 2 and "holds no prompt" in no_prompt.stderr
    missing = gate("bench", "--url", url, "--prompts", str(tmp_path / "nope.jsonl"), "--rate", "5", cwd=tmp_path)
    assert missing.returncode == 2 and "file not found" in missing.stderr
    closed = gate("bench", "--url", url, "--concurrency", "2", "--arrival", "constant", cwd=tmp_path)
    assert closed.returncode == 2 and "--arrival is for open loops" in closed.stderr
    odd = gate("bench", "--url", url, "--rate", "5", "--arrival", "uniform", cwd=tmp_path)
    assert odd.returncode == 2 and "choose poisson, gamma or constant" in odd.stderr


def test_prompt_lengths_come_from_the_tokenizer_when_there_is_one(tmp_path: Path) -> None:
    def by_words(text: str) -> dict[str, list[int]]:
        return {"input_ids": [0] * (len(text.split()) + 1)}  # a BOS and one token a word

    path = write(tmp_path / "p.jsonl", ROWS)
    assert [p.prompt_tokens for p in load_prompt_file(path, by_words)] == [4, 8, 2]
    assert [p.prompt_tokens for p in load_prompt_file(path)] == [4, 9, 1]  # about 4 characters a token
    specs = with_prompts(make_requests(Workload(rate_rps=5, num_requests=3)), load_prompt_file(path, by_words))
    assert [(s.text, s.prompt_tokens, s.output_tokens) for s in specs] == [
        (ROWS[0]["prompt"], 4, 3),
        (ROWS[1]["prompt"], 8, 5),
        (ROWS[2]["prompt"], 2, 2),
    ]


def test_constant_arrivals_are_evenly_spaced_at_the_rate() -> None:
    specs = make_requests(Workload(arrival="constant", rate_rps=5, num_requests=50), seed=3)
    assert np.allclose(np.diff([s.arrival_s for s in specs]), 0.2) and specs[0].arrival_s == 0.0
    with pytest.raises(ValidationError, match="arrival: constant needs rate_rps"):
        Workload(arrival="constant")
