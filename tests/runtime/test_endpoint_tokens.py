"""An endpoint whose remote sends no token ids (servegate's own server, TGI, SGLang, llama.cpp): its tokens
come from the remote's logprobs, its logprobs pass through in the OpenAI shape, and a remote that gives none
when asked is refused with the declared error, never answered with an empty list (issue 33)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.fake_remote import FakeRemote, RemoteBehaviour
from support.servegate_remote import ServegateRemote

from servegate.contracts.manifest import ServedModel
from servegate.runtime import build
from servegate.runtime.engine.offline import run_file
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest, SamplingParams

PROMPTS = ["12+34=", "7+8=", "the code is 4417. recall: ", "503+96="]
REMOTE: dict[str, Any] = {
    "name": "remote",
    "weights": {"source": "zoo:tiny-primary"},
    "preprocess": {"chat_template": "none", "max_input_tokens": 64, "tenant_from": "none"},
    "runtime": {"max_model_len": 128, "threads": 1},
    "postprocess": {"max_output_tokens": 16, "logprobs": True},
}


def endpoint(url: str, **postprocess: Any) -> ServedModel:
    """The remote's manifest with the same settings, served through `runtime.backend: endpoint`."""
    data = json.loads(json.dumps(REMOTE))
    data["name"] = "gateway"
    data["runtime"].update(backend="endpoint", endpoint_url=url, endpoint_model="remote")
    data["postprocess"].update(postprocess)
    return ServedModel.model_validate(data)


@pytest.fixture(scope="module")
def remote() -> Iterator[ServegateRemote]:
    with ServegateRemote(REMOTE) as running:
        yield running


@pytest.fixture(scope="module")
def reference() -> Any:
    """The remote's manifest on the reference engine here: what an honest remote must answer."""
    return build(ServedModel.model_validate(REMOTE), fallback=False)


def greedy(prompt: str, **params: Any) -> GenerationRequest:
    return GenerationRequest(prompt, prompt=prompt, params=SamplingParams(max_tokens=8, **params))


def test_tokens_of_a_remote_without_token_ids_are_read_from_its_logprobs(remote: Any, reference: Any) -> None:
    """The issue: the ids were the text re-tokenized (no EOS), so every honest answer differed from the reference."""
    answers = build(endpoint(remote.url)).generate([greedy(p) for p in PROMPTS])
    expected = reference.generate([greedy(p) for p in PROMPTS])
    for got, want in zip(answers, expected, strict=True):
        assert isinstance(got, FinishEvent) and isinstance(want, FinishEvent)
        assert (got.text, got.token_ids) == (want.text, want.token_ids)
        assert got.token_source == "logprobs" and got.logprobs is None  # asked to name tokens, not returned
    assert any(a.finish_reason == "eos" for a in answers)  # EOS is among the ids, as the engine made them


def _gateway(served: ServedModel, calls: list[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
    """POST each (path, body) to `gate serve` of `served` (in process) once it is ready."""
    from servegate.server import create_app

    async def scenario() -> list[httpx.Response]:
        app = create_app(served)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gate", timeout=60) as client:
                for _ in range(400):
                    if (await client.get("/ready")).status_code == 200:
                        break
                    await asyncio.sleep(0.05)
                return [await client.post(path, json=body) for path, body in calls]

    return asyncio.run(scenario())


def _streamed(response: httpx.Response) -> list[dict[str, Any]]:
    lines = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_logprobs_pass_through_in_the_openai_shape(remote: Any) -> None:
    ask = {"model": "gateway", "prompt": "12+34=", "max_tokens": 8, "temperature": 0, "logprobs": 2}
    chat = {"model": "gateway", "messages": [{"role": "user", "content": "12+34="}], "max_tokens": 8,
            "temperature": 0, "logprobs": True, "top_logprobs": 2}  # fmt: skip
    own = httpx.post(remote.url + "/completions", json={**ask, "model": "remote"}, timeout=60).json()
    through, talk, stream = _gateway(
        endpoint(remote.url),
        [("/v1/completions", ask), ("/v1/chat/completions", chat), ("/v1/completions", {**ask, "stream": True})],
    )
    assert through.status_code == 200, through.text
    choice = through.json()["choices"][0]
    logprobs = choice["logprobs"]
    n = through.json()["usage"]["completion_tokens"]
    assert n > 0 and all(len(logprobs[k]) == n for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"))
    assert logprobs == own["choices"][0]["logprobs"]  # as the remote answered it
    assert all(
        len(top) == 2 and token in top for token, top in zip(logprobs["tokens"], logprobs["top_logprobs"], strict=True)
    )
    content = talk.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == talk.json()["usage"]["completion_tokens"] > 0
    assert all({"token", "logprob", "top_logprobs"} <= set(c) and len(c["top_logprobs"]) == 2 for c in content)
    parts = [c["choices"][0]["logprobs"] for c in _streamed(stream) if c["choices"] and c["choices"][0]["logprobs"]]
    assert [t for p in parts for t in p["tokens"]] == logprobs["tokens"]
    assert [v for p in parts for v in p["token_logprobs"]] == logprobs["token_logprobs"]


def test_gate_run_writes_the_remotes_logprobs_in_the_api_shape(remote: Any, tmp_path: Path) -> None:
    chat = {"id": 2, "messages": [{"role": "user", "content": "7+8="}], "temperature": 0, "logprobs": True}
    lines = [{"id": 1, "prompt": "12+34=", "max_tokens": 8, "temperature": 0, "logprobs": 1}, chat]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    asyncio.run(run_file(endpoint(remote.url), tmp_path / "in.jsonl", tmp_path / "out.jsonl"))
    completion, chat = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    n = completion["usage"]["completion_tokens"]
    assert n > 0 and [len(completion["logprobs"][k]) for k in ("tokens", "token_logprobs", "text_offset")] == [n] * 3
    assert completion["logprobs"]["tokens"][-1] == "<eos>" or completion["finish_reason"] == "length"
    assert len(chat["logprobs"]["content"]) == chat["usage"]["completion_tokens"] > 0


def test_a_remote_that_gives_no_logprobs_when_asked_is_refused_not_answered_empty() -> None:
    behaviour = RemoteBehaviour(engine="tgi", version="3.0", logprobs=False, answer=lambda ids, n: "42")
    ask = {"model": "gateway", "prompt": "1+1=", "max_tokens": 4, "logprobs": 1}
    chat = {"model": "gateway", "messages": [{"role": "user", "content": "1+1="}], "logprobs": True}
    with FakeRemote(behaviour) as fake:
        served = endpoint(fake.url)
        plain, streamed, talk = _gateway(
            served,
            [
                ("/v1/completions", ask),
                ("/v1/completions", {**ask, "stream": True}),
                ("/v1/chat/completions", chat),
            ],  # fmt: skip
        )
        [untouched] = build(served).generate([greedy("1+1=")])
    for response in (plain, streamed, talk):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("unsupported_parameter", "logprobs")
        assert fake.url in error["message"]
    assert isinstance(untouched, FinishEvent) and untouched.text == "42"  # without logprobs it answers
    assert untouched.token_source == "tokenizer"  # nothing named the tokens: the text, re-tokenized


def test_a_remote_that_refuses_logprobs_is_asked_again_without_them_when_the_client_wanted_none() -> None:
    no_logprobs = json.loads(json.dumps(REMOTE))
    no_logprobs["postprocess"]["logprobs"] = False  # servegate answers a request for logprobs with 400
    with ServegateRemote(no_logprobs) as remote:
        engine = build(endpoint(remote.url))
        first, second = engine.generate([greedy("12+34="), greedy("7+8=")])
        [asked] = engine.generate([greedy("12+34=", logprobs=True)])
    assert isinstance(first, FinishEvent) and isinstance(second, FinishEvent)
    assert first.token_source == second.token_source == "tokenizer" and first.text
    assert engine.names_tokens is False  # asked once, not on every request
    assert isinstance(asked, ErrorEvent) and asked.error.code == "unsupported_parameter"
    assert asked.error.param == "logprobs"


def test_a_vllm_remote_sends_its_token_ids_and_is_not_asked_for_logprobs() -> None:
    behaviour = RemoteBehaviour(answer=lambda ids, n: "579", token_ids=lambda text: [25, 27, 29, 2])
    with FakeRemote(behaviour) as fake:
        [result] = build(endpoint(fake.url)).generate([greedy("123+456=")])
    assert isinstance(result, FinishEvent)
    assert result.token_ids == (25, 27, 29, 2) and result.token_source == "remote"
    [body] = fake.bodies
    assert body["return_token_ids"] is True and "logprobs" not in body
