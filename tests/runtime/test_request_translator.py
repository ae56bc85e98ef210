"""One request translator: the same body through `gate serve` and `gate run` reaches the engine as the same request.

Both paths hand the engine's `submit` what `runtime/request_translator.engine_requests` built; a recording engine
(the oracle double) captures them and the test compares them field by field.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.manifests import fake_manifest
from support.oracle_engine import OracleEngine

from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.offline import run_file
from servegate.runtime.types import GenerationRequest, SamplingParams
from servegate.server import create_app

SERVED = ServedModel.model_validate(
    fake_manifest(preprocess={"tenant_from": "user", "max_input_tokens": 64, "unseeded_sampling": "fresh"})
)


@dataclasses.dataclass
class Recording(OracleEngine):
    """The oracle engine, keeping every request it was given."""

    seen: list[GenerationRequest] = dataclasses.field(default_factory=list)

    async def submit(self, request: GenerationRequest):  # type: ignore[override]
        self.seen.append(request)
        async for event in super().submit(request):
            yield event


BODIES: list[tuple[str, dict[str, Any]]] = [
    ("completions", {"prompt": "12+34=", "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": 5,
                     "seed": 11, "stop": ["\n"], "logprobs": 2, "ignore_eos": True, "user": "tenant-a"}),
    ("completions", {"prompt": [3, 4, 5], "max_tokens": 4, "temperature": 0, "user": "tenant-b"}),
    ("chat", {"messages": [{"role": "system", "content": "be brief"},
                           {"role": "user", "content": "12+34=", "name": "ada"}],
              "max_completion_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 1, "ignore_eos": True,
              "user": "tenant-c"}),
    ("chat", {"messages": [{"role": "user", "content": "12+34="}], "max_tokens": 6, "temperature": 0.5, "seed": 3,
              "presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.2, "min_p": 0.05,
              "min_tokens": 2, "stop_token_ids": [7, 7, 9], "logit_bias": {"12": 250, "8": -3.5},
              "user": "tenant-d"}),
]  # fmt: skip


def _comparable(request: GenerationRequest) -> dict[str, Any]:
    """Every field but those that name the path (id) or the moment (arrival)."""
    fields = dataclasses.asdict(request)
    return {k: v for k, v in fields.items() if k not in ("id", "arrival_time")}


def through_serve(endpoint: str, body: dict[str, Any]) -> GenerationRequest:
    engine = Recording(SERVED)
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    with TestClient(create_app(SERVED, engine=engine)) as client:  # type: ignore[arg-type]
        answer = client.post(path, json={"model": SERVED.name, **body})
    assert answer.status_code == 200, answer.text
    [request] = engine.seen
    return request


def through_run(body: dict[str, Any], folder: Path) -> GenerationRequest:
    engine = Recording(SERVED)
    (folder / "in.jsonl").write_text(json.dumps({"id": "line-1", **body}) + "\n")

    async def go() -> None:
        await engine.start()
        await run_file(SERVED, folder / "in.jsonl", folder / "out.jsonl", engine=engine)

    asyncio.run(go())
    assert "error" not in json.loads((folder / "out.jsonl").read_text())
    [request] = engine.seen
    return request


@pytest.mark.parametrize(
    ("endpoint", "body"), BODIES, ids=["completion-sampled", "completion-ids", "chat", "chat-shaped"]
)
def test_gate_serve_and_gate_run_give_the_engine_the_same_request(
    endpoint: str, body: dict[str, Any], tmp_path: Path
) -> None:
    served, ran = through_serve(endpoint, body), through_run(body, tmp_path)
    assert _comparable(served) == _comparable(ran)
    assert ran.params.ignore_eos == body.get("ignore_eos", False)  # gate run used to drop it
    if endpoint == "chat" and "name" in str(body["messages"]):
        assert ran.messages is not None and ran.messages[1]["name"] == "ada"  # and the participant's name
    if "logit_bias" in body:  # ids in order, bias clamped to 100 as vLLM does, stop ids once each
        assert ran.params.logit_bias == ((8, -3.5), (12, 100.0))
        assert ran.params.stop_token_ids == (7, 9) and ran.params.min_tokens == 2
        assert (ran.params.presence_penalty, ran.params.frequency_penalty) == (0.5, -0.25)
        assert (ran.params.repetition_penalty, ran.params.min_p) == (1.2, 0.05)


def test_an_unseeded_sampled_line_follows_unseeded_sampling_in_gate_run_too(tmp_path: Path) -> None:
    """`fresh` draws a seed per request on every path (gate run used to seed it with runtime.seed)."""
    body = {"prompt": "12+34=", "max_tokens": 3, "temperature": 1.0}
    seeds = set()
    for attempt in range(3):
        (tmp_path / str(attempt)).mkdir()
        seeds.add(through_run({**body, "user": "t"}, tmp_path / str(attempt)).params.seed)
    assert len(seeds) == 3 and SERVED.runtime.seed not in seeds


def test_the_remote_is_sent_each_shaping_field_in_vllms_spelling_and_only_when_it_asks_for_something() -> None:
    from servegate.runtime.remote.completions_stream import shaping_fields

    asked = SamplingParams(presence_penalty=0.5, repetition_penalty=1.1, logit_bias=((5, -2.0),), min_tokens=3,
                           stop_token_ids=(9,), min_p=0.2, frequency_penalty=0.1)  # fmt: skip
    assert shaping_fields(asked) == {
        "presence_penalty": 0.5,
        "frequency_penalty": 0.1,
        "repetition_penalty": 1.1,
        "logit_bias": {"5": -2.0},
        "min_p": 0.2,
        "min_tokens": 3,
        "stop_token_ids": [9],
    }
    assert shaping_fields(SamplingParams()) == {}


BAD_FIELDS: list[tuple[str, dict[str, Any], SamplingParams | None, str]] = [
    ("completions", {"prompt": "ab", "temperature": 2.5}, SamplingParams(temperature=2.5), "temperature"),
    ("completions", {"prompt": "ab", "top_p": 0}, SamplingParams(top_p=0), "top_p"),
    ("chat", {"messages": [{"role": "user", "content": "ab"}], "max_tokens": 4, "min_tokens": 9},
     SamplingParams(max_tokens=4, min_tokens=9), "min_tokens"),
    ("completions", {"prompt": "ab", "stop_token_ids": [9999]}, SamplingParams(stop_token_ids=(9999,)),
     "stop_token_ids"),
    ("completions", {"prompt": "ab", "logprobs": 1}, SamplingParams(logprobs=True), "logprobs"),
    ("completions", {"prompt": [5, 9999]}, None, "prompt"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("endpoint", "body", "params", "param"),
    BAD_FIELDS,
    ids=["range", "open-range", "across-fields", "stop-id-vocabulary", "logprobs-offered", "prompt-vocabulary"],
)
def test_a_bad_field_is_refused_once_in_the_same_words_on_every_path(
    endpoint: str, body: dict[str, Any], params: SamplingParams | None, param: str, tmp_path: Path
) -> None:
    """`gate serve`, `gate run` and a request built in code (a gate's probe, the bench) get one message for one
    bad value: the API's, from the one check of that field on each path."""
    from runtime_factories import toy_engine, toy_manifest

    served = toy_manifest(name="tiny")  # no logprobs offered
    engine = toy_engine(served)
    try:
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        with TestClient(create_app(served, engine=engine, owns_engine=False)) as client:
            answer = client.post(path, json={"model": served.name, **body})
        assert answer.status_code == 400, answer.text
        on_serve = answer.json()["error"]
        (tmp_path / "in.jsonl").write_text(json.dumps({"id": 1, **body}) + "\n")
        asyncio.run(run_file(served, tmp_path / "in.jsonl", tmp_path / "out.jsonl", engine=engine))
        on_run = json.loads((tmp_path / "out.jsonl").read_text())["error"]
        assert on_serve == on_run and on_serve["param"] == param and on_serve["code"] == "invalid_request"
        direct = GenerationRequest("direct", prompt_token_ids=[5, 9999] if params is None else [5], params=params or
                                   SamplingParams())  # fmt: skip
        [refused] = engine.generate([direct])
    finally:
        engine.shutdown_sync()
    assert refused.error.to_body()["error"] == on_serve  # type: ignore[union-attr]
