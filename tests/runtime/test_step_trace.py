"""The engine's optional step trace: one line per step, only when one is handed to it (the server opens it from
SERVEGATE_STEP_TRACE)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from runtime_factories import create_sequences, reference_outputs, token_requests, toy_engine, toy_manifest

from servegate.contracts.errors import ServingError
from servegate.runtime.engine.delivery import EventDelivery
from servegate.runtime.engine.step_trace import ENV, StepTrace, read_admissions, read_handoffs, read_step_trace
from servegate.runtime.types import ErrorEvent, TokenEvent


def test_a_traced_engine_records_every_step_it_ran(tmp_path: Path) -> None:
    trace = tmp_path / "steps.jsonl"
    seqs = create_sequences(6, prompt_lens=(3, 20), max_tokens=(2, 6), seed=3)
    engine = toy_engine(step_trace=StepTrace(trace))
    try:
        results = engine.generate(token_requests(seqs))
    finally:
        engine.shutdown_sync()
    records = read_step_trace(trace)
    assert records, "no step was recorded"
    for r in records:
        assert r["ended"] >= r["began"]
        assert r["arrivals"] >= 0
        assert all(n >= 1 and start >= 0 for n, start in r["chunks"])
    # every prompt token was prefilled and every output token but the last went back in as a decode
    expected = reference_outputs(seqs)
    computed = sum(n for r in records for n, _ in r["chunks"])
    assert computed == sum(s.num_prompt_tokens + len(expected[s.seq_id]) - 1 for s in seqs)
    assert sum(r["arrivals"] for r in records) <= len(results)
    assert sum(r["completed"] for r in records) == len(results) == 6  # each request answered by one step


def test_a_traced_engine_records_when_it_admitted_each_request(tmp_path: Path) -> None:
    trace = tmp_path / "steps.jsonl"
    seqs = create_sequences(5, prompt_lens=(3, 12), max_tokens=(2, 4), seed=5)
    requests = token_requests(seqs)
    engine = toy_engine(step_trace=StepTrace(trace))
    try:
        before = time.perf_counter()
        engine.generate(requests)
    finally:
        engine.shutdown_sync()
    admissions, steps = read_admissions(trace), read_step_trace(trace)
    assert sorted(a["request"] for a in admissions) == sorted(r.id for r in requests)
    times = [a["admitted"] for a in admissions]
    assert times == sorted(times)  # written under the engine lock, in the order the engine decided
    # on the steps' clock: after the caller sent them, before the steps that answered them ended
    assert all(before <= t <= steps[-1]["ended"] for t in times)
    assert min(times) <= steps[0]["ended"]
    assert all("began" in r for r in steps) and not any("request" in r for r in steps)


def test_a_traced_engine_records_when_it_handed_each_first_token_and_result_to_the_sink(tmp_path: Path) -> None:
    trace = tmp_path / "steps.jsonl"
    seqs = create_sequences(5, prompt_lens=(3, 12), max_tokens=(2, 4), seed=6)
    requests = token_requests(seqs)
    engine = toy_engine(step_trace=StepTrace(trace))
    try:
        engine.generate(requests)
    finally:
        engine.shutdown_sync()
    handoffs, steps = read_handoffs(trace), read_step_trace(trace)
    admitted = {a["request"]: a["admitted"] for a in read_admissions(trace)}
    first = {h["request"]: h["first_token"] for h in handoffs if "first_token" in h}
    final = {h["request"]: h["finished"] for h in handoffs if "finished" in h}
    ids = sorted(r.id for r in requests)
    assert sorted(first) == sorted(final) == ids and len(handoffs) == 2 * len(ids)  # one line per event
    for rid in ids:  # on the steps' clock: admitted, then its first token, then its result, each inside a step
        assert admitted[rid] <= first[rid] <= final[rid]
        for t in (first[rid], final[rid]):
            assert any(s["began"] <= t <= s["ended"] for s in steps)
    assert read_admissions(trace) and not any("first_token" in a or "finished" in a for a in read_admissions(trace))
    assert not any("request" in r for r in steps)


def test_a_failed_request_records_its_error_handoff_and_an_untraced_delivery_records_nothing(tmp_path: Path) -> None:
    trace = tmp_path / "steps.jsonl"
    events: list[object] = []
    streamed = EventDelivery(events.append, StepTrace(trace), "cmpl-a")
    streamed.token(TokenEvent("cmpl-a", (1,), "a", None, 0.0))
    streamed.token(TokenEvent("cmpl-a", (2,), "b", None, 0.0))  # not the first: no line
    assert streamed.close() is True
    streamed.send_last(ErrorEvent("cmpl-a", ServingError("internal")))  # the path deliver_failures takes
    quiet = EventDelivery(events.append)
    quiet.token(TokenEvent("cmpl-b", (1,), "a", None, 0.0))
    quiet.finish(ErrorEvent("cmpl-b", ServingError("internal")))
    lines = read_handoffs(trace)
    assert [sorted(h) for h in lines] == [["first_token", "request"], ["finished", "request"]]
    assert {h["request"] for h in lines} == {"cmpl-a"} and lines[0]["first_token"] <= lines[1]["finished"]
    assert len(events) == 5


def test_a_refused_request_is_recorded_as_refused_and_old_traces_have_no_admissions(tmp_path: Path) -> None:
    trace = tmp_path / "steps.jsonl"
    recorder = StepTrace(trace)
    recorder.admission("cmpl-a", 10.0)
    recorder.admission("cmpl-b", 10.5, admitted=False)
    recorder.close()
    recorder.admission("cmpl-c", 11.0)  # after close: dropped
    assert read_admissions(trace) == [{"request": "cmpl-a", "admitted": 10.0}, {"request": "cmpl-b", "refused": 10.5}]
    assert read_step_trace(trace) == []
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"began": 1.0, "ended": 1.5, "chunks": [[4, 0]], "arrivals": 1}) + "\n")
    assert read_admissions(old) == [] and len(read_step_trace(old)) == 1


def test_a_step_answering_requests_is_charged_to_the_step_that_follows_it_at_once() -> None:
    from servegate.capacity.latency.serving_trace import serving_steps

    def step(began: float, ended: float, completed: int) -> dict[str, object]:
        return {"began": began, "ended": ended, "chunks": [[1, 9]], "arrivals": 0, "completed": completed}

    # 2 answered, next step 0.5 ms later (at once); 1 answered, next step 50 ms later (the server idled)
    steps = serving_steps([step(0.0, 0.01, 2), step(0.0105, 0.02, 1), step(0.07, 0.08, 0)])
    assert [s.after_completed for s in steps] == [0, 2, 0]
    # a trace written before steps recorded answers reads as none answered
    old = [{"began": 0.0, "ended": 0.01, "chunks": [[1, 9]], "arrivals": 0}] * 2
    assert [s.after_completed for s in serving_steps(old)] == [0, 0]


def test_an_untraced_engine_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "steps.jsonl"))  # the engine itself never reads the variable
    monkeypatch.chdir(tmp_path)
    engine = toy_engine()
    try:
        engine.generate(token_requests(create_sequences(2, prompt_lens=(3, 5), max_tokens=(2, 3), seed=1)))
    finally:
        engine.shutdown_sync()
    assert engine.step_trace is None and list(tmp_path.iterdir()) == []


def test_the_server_opens_the_trace_the_variable_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from servegate.server.app import _build_engine

    trace = tmp_path / "steps.jsonl"
    monkeypatch.setenv(ENV, str(trace))
    engine = _build_engine(toy_manifest())
    assert isinstance(engine.step_trace, StepTrace)
    engine.step_trace.close()
    monkeypatch.delenv(ENV)
    assert _build_engine(toy_manifest()).step_trace is None


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    trace = tmp_path / "steps.jsonl"
    line = json.dumps({"began": 1.0, "ended": 1.5, "chunks": [[4, 0]], "arrivals": 1})
    trace.write_text(line + "\n" + line[:12], encoding="utf-8")
    assert read_step_trace(trace) == [json.loads(line)]
