"""`gate run`'s file logic on the toy engine: order, ids, catalogued errors, resume after a torn write."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from runtime_factories import toy_engine, toy_manifest

from servegate.contracts.errors import ServegateError
from servegate.runtime.engine.offline import run_file

LINES = [
    {"id": i if i % 2 else f"s{i}", "prompt": "abc" * (1 + i % 5), "max_tokens": 3 + i % 7, "temperature": 0}
    for i in range(30)
]


def write_lines(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def run(tmp_path: Path, src: Path, out: Path, mode: str = "offline", **kw):
    served = toy_manifest(batching={"mode": mode})
    engine = toy_engine(served)
    try:
        return asyncio.run(run_file(served, src, out, engine=engine, **kw))
    finally:
        engine.shutdown_sync()


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_results_come_in_input_order_with_ids_usage_and_catalogued_errors(tmp_path: Path) -> None:
    lines = LINES[:6] + [
        {"id": "hot", "prompt": "abc", "temperature": 9},
        {"id": "odd", "prompt": "abc", "colour": "blue"},
        {"id": "chat", "messages": [{"role": "user", "content": "abcabc"}], "max_tokens": 4, "temperature": 0},
    ]
    src = write_lines(tmp_path / "in.jsonl", lines)
    summary = run(tmp_path, src, tmp_path / "out.jsonl")
    out = records(tmp_path / "out.jsonl")
    assert [r["id"] for r in out] == [line["id"] for line in lines]
    ok = out[0]
    assert set(ok) == {"id", "text", "finish_reason", "usage"}
    assert ok["usage"]["completion_tokens"] <= 3 and ok["usage"]["prompt_tokens"] == 3
    assert out[6]["error"]["code"] == "invalid_request" and out[6]["error"]["param"] == "temperature"
    assert out[7]["error"]["code"] == "unknown_parameter" and out[7]["error"]["param"] == "colour"
    assert out[8]["usage"]["completion_tokens"] >= 1
    assert summary.completed == 7 and dict(summary.errors) == {"invalid_request": 1, "unknown_parameter": 1}


@pytest.mark.parametrize("mode", ["none", "continuous"])
def test_a_rerun_after_a_torn_write_completes_the_file_exactly_once(tmp_path: Path, mode: str) -> None:
    src = write_lines(tmp_path / "in.jsonl", LINES)
    full = tmp_path / "full.jsonl"
    run(tmp_path, src, full, mode=mode)
    expected = full.read_bytes().splitlines(keepends=True)
    partial = tmp_path / "partial.jsonl"
    partial.write_bytes(b"".join(expected[:11]) + expected[11][:17])  # killed while writing line 12
    summary = run(tmp_path, src, partial, mode=mode)
    assert summary.skipped == 11 and summary.completed == len(LINES) - 11
    assert partial.read_bytes() == full.read_bytes()
    again = run(tmp_path, src, partial, mode=mode)  # nothing left to do: nothing written
    assert again.skipped == len(LINES) and again.completed == 0
    assert partial.read_bytes() == full.read_bytes()


def test_a_window_of_one_and_a_wide_window_write_the_same_file(tmp_path: Path) -> None:
    src = write_lines(tmp_path / "in.jsonl", LINES)
    run(tmp_path, src, tmp_path / "narrow.jsonl", window=1)
    run(tmp_path, src, tmp_path / "wide.jsonl", window=64)
    assert (tmp_path / "narrow.jsonl").read_bytes() == (tmp_path / "wide.jsonl").read_bytes()


def test_input_and_output_mistakes_are_usage_errors(tmp_path: Path) -> None:
    dup = write_lines(
        tmp_path / "dup.jsonl", [{"id": 1, "prompt": "a"}, {"id": 2, "prompt": "b"}, {"id": 1, "prompt": "c"}]
    )
    with pytest.raises(ServegateError, match=r"dup.jsonl:3: id 1 repeats line 1"):
        run(tmp_path, dup, tmp_path / "o1.jsonl")
    (tmp_path / "noid.jsonl").write_text('{"prompt": "a"}\n')
    with pytest.raises(ServegateError, match=r"noid.jsonl:1: .*\"id\""):
        run(tmp_path, tmp_path / "noid.jsonl", tmp_path / "o2.jsonl")
    src = write_lines(tmp_path / "in.jsonl", LINES[:3])
    stranger = tmp_path / "other.jsonl"
    stranger.write_text('{"id": "zzz", "text": ""}\n')
    with pytest.raises(ServegateError, match="is not in the input"):
        run(tmp_path, src, stranger)
    assert stranger.read_text() == '{"id": "zzz", "text": ""}\n'  # nothing appended to a foreign file
