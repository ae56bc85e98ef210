"""`gate run` from the command line on a tiny random Llama saved to disk: every mode, and SIGKILL + resume."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.models import save_tiny_llama
from typer.testing import CliRunner

from servegate.cli.app import app
from servegate.runtime.model.onednn_linear import onednn_available

pytest.importorskip("servegate.runtime.preprocess")

MANIFEST = """\
apiVersion: servegate/v1
kind: ServedModel
name: tiny
weights: {source: ./model}
preprocess: {max_input_tokens: 64, chat_template: none}
postprocess: {max_output_tokens: 24}
runtime: {max_model_len: 128, dtype: float32, threads: 1, kv_cache: {block_size: 8, memory_budget: 4MiB}}
batching: {mode: offline, max_batch_size: 8, max_num_batched_tokens: 256}
failure_policy: {request_timeout_s: 600}
"""
WORDS = ["the", "model", "reads", "12+30=", "key=ABCD;", "a", "note", '{"a":1}']


@pytest.fixture(scope="module")
def served_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a manifest and a tiny random Llama + the zoo's char tokenizer, saved as safetensors."""
    root = tmp_path_factory.mktemp("gate-run")
    save_tiny_llama(root / "model")
    (root / "manifest.yaml").write_text(MANIFEST)
    return root


def write_input(path: Path, n: int, seed: int = 0, max_tokens: tuple[int, int] = (4, 24)) -> Path:
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
        line = {"id": i, "prompt": prompt, "max_tokens": rng.randint(*max_tokens), "temperature": 0}
        if i % 7 == 3:
            chat = [{"role": "user", "content": prompt}]
            line = {"id": f"chat-{i}", "messages": chat, "max_tokens": line["max_tokens"], "temperature": 0}
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("mode", ["none", "static", "dynamic", "continuous", "offline"])
def test_gate_run_works_in_every_batching_mode(served_dir: Path, tmp_path: Path, mode: str) -> None:
    src = write_input(tmp_path / "in.jsonl", 10)
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    sets = ["--set", f"batching.mode={mode}"]
    if mode != "continuous":
        sets += ["--set", "batching.chunked_prefill=false"]
    result = CliRunner().invoke(
        app, ["run", str(served_dir / "manifest.yaml"), "-i", str(src), "-o", str(out), "--json", str(summary), *sets]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [json.loads(line)["id"] for line in src.read_text().splitlines()]
    assert all(set(r) == {"id", "text", "finish_reason", "usage"} for r in records)
    assert all(r["usage"]["completion_tokens"] >= 1 for r in records)
    report = json.loads(summary.read_text())
    assert report["completed"] == 10 and report["output_tokens"] == sum(
        r["usage"]["completion_tokens"] for r in records
    )


def gate_run(served_dir: Path, src: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servegate.cli",
            "run",
            str(served_dir / "manifest.yaml"),
            "-i",
            str(src),
            "-o",
            str(out),
            "--set",
            "batching.mode=none",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "120"},
    )


def test_sigkill_mid_file_then_rerun_gives_the_uninterrupted_file(served_dir: Path, tmp_path: Path) -> None:
    # mode none: each request is computed alone, so the two runs compute every request identically
    src = write_input(tmp_path / "in.jsonl", 40, seed=1, max_tokens=(2, 10))
    whole = tmp_path / "whole.jsonl"
    sets = ["--set", "batching.mode=none"]
    result = CliRunner().invoke(
        app, ["run", str(served_dir / "manifest.yaml"), "-i", str(src), "-o", str(whole), *sets]
    )
    assert result.exit_code == 0, result.output
    killed = tmp_path / "killed.jsonl"
    process = gate_run(served_dir, src, killed)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not killed.exists() or killed.read_bytes().count(b"\n") < 5):
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    written = killed.read_bytes().count(b"\n")
    assert 5 <= written < 40, "the kill must land mid-file"
    rerun = gate_run(served_dir, src, killed)
    assert rerun.wait(timeout=600) == 0, rerun.stderr.read() if rerun.stderr else ""
    lines = killed.read_text().splitlines()
    ids = [json.loads(line)["id"] for line in lines]
    assert len(ids) == len(set(ids)) == 40
    assert sorted(lines) == sorted(whole.read_text().splitlines())
    assert killed.read_bytes() == whole.read_bytes()  # and even in the same order


@pytest.mark.skipif(
    not any(os.access(os.path.join(d, "g++"), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep)),
    reason="runtime.compile needs a C++ compiler",
)
@pytest.mark.parametrize(
    ("compile_mode", "batching", "ready_message"),
    [
        # mode none: every decode step is one sequence, the compiled batch size; the prefills run eagerly
        ("decode", "none", "decode graph for 1 sequence(s) ready"),
        # continuous batching: prefills, mixed and decode steps of several sequences run the one compiled graph
        ("steps", "continuous", "steps graph ready"),
    ],
)
def test_gate_run_with_a_compiled_runtime_writes_the_eager_runs_lines(
    served_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    compile_mode: str,
    batching: str,
    ready_message: str,
) -> None:
    # the eager steps beside the graphs go through oneDNN where torch has it
    caplog.set_level("INFO", logger="servegate.runtime")
    src = write_input(tmp_path / "in.jsonl", 10, seed=2, max_tokens=(4, 12))
    outputs = {}
    for mode in ("off", compile_mode):
        out = tmp_path / f"{mode}.jsonl"
        sets = ["--set", f"batching.mode={batching}", "--set", f"runtime.compile={mode}"]
        if mode != "off" and onednn_available():
            sets += ["--set", "runtime.cpu_linear=onednn"]
        result = CliRunner().invoke(
            app, ["run", str(served_dir / "manifest.yaml"), "-i", str(src), "-o", str(out), *sets]
        )
        assert result.exit_code == 0, result.output
        outputs[mode] = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(outputs[compile_mode]) == 10
    assert outputs[compile_mode] == outputs["off"]
    ready = [r.getMessage() for r in caplog.records if ready_message in r.getMessage()]
    assert len(ready) == 1  # compiled once, in the compiled run only
    routed = [r.getMessage() for r in caplog.records if "routed through oneDNN" in r.getMessage()]
    assert len(routed) == (1 if onednn_available() else 0)
    assert not [r for r in caplog.records if "would recompile" in r.getMessage()]
