"""`echo: true` on /v1/completions against `gate serve`: the prompt and its log-probabilities, vLLM's shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.manifests import fake_manifest, real_manifest
from support.servers import ServerProcess, start_fake_server, start_gate_serve

from servegate.contracts.manifest import ServedModel
from servegate.runtime import build
from servegate.runtime.types import GenerationRequest


@pytest.fixture(scope="module")
def server(module_dir: Path, weights_source: str) -> Iterator[tuple[ServerProcess, dict]]:
    manifest = real_manifest(weights_source, preprocess={"truncation": "left", "max_input_tokens": 24})
    process = start_gate_serve(module_dir, manifest)
    process.wait_until("/ready", 200, timeout_s=240)
    yield process, manifest
    assert process.stop() == 0


def post(server: ServerProcess, **body: object) -> httpx.Response:
    return httpx.post(server.url("/v1/completions"), json={"model": "tiny", **body}, timeout=60)


def test_echo_with_max_tokens_0_scores_the_prompt_as_the_engine_does(server: tuple[ServerProcess, dict]) -> None:
    process, manifest = server
    answer = post(process, prompt="796+439=", echo=True, logprobs=1, max_tokens=0)
    assert answer.status_code == 200, answer.text
    [choice] = answer.json()["choices"]
    logprobs = choice["logprobs"]
    assert choice["text"] == "796+439=" and logprobs["tokens"] == ["<bos>", *"796+439="]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert answer.json()["usage"]["completion_tokens"] == 0 and answer.json()["usage"]["prompt_tokens"] == 9
    engine = build(ServedModel.model_validate(manifest))
    try:
        [scored] = engine.score([GenerationRequest("x", prompt="796+439=")])
    finally:
        engine.shutdown_sync()
    assert logprobs["token_logprobs"][1:] == pytest.approx(list(scored.logprobs[1:]), abs=1e-5)
    for value, top in zip(logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:], strict=True):
        assert len(top) == 1 and max(top.values()) >= value - 1e-6


def test_echo_with_tokens_appends_the_completion(server: tuple[ServerProcess, dict]) -> None:
    process, _ = server
    answer = post(process, prompt=[[1, 28, 30, 27]], echo=True, logprobs=1, max_tokens=2, temperature=0)
    [choice] = answer.json()["choices"]
    plain = post(process, prompt=[[1, 28, 30, 27]], logprobs=1, max_tokens=2, temperature=0).json()["choices"][0]
    assert choice["text"] == "<bos>796" + plain["text"]  # token-id prompts echo their decoded ids, as vLLM
    assert len(choice["logprobs"]["token_logprobs"]) == 4 + len(plain["logprobs"]["token_logprobs"])
    assert choice["logprobs"]["token_logprobs"][4:] == plain["logprobs"]["token_logprobs"]


def test_a_truncated_prompt_echoes_the_tokens_the_model_saw(server: tuple[ServerProcess, dict]) -> None:
    process, _ = server
    answer = post(process, prompt="x" * 40 + "1+2=", echo=True, logprobs=0, max_tokens=0)
    body = answer.json()
    assert len(body["choices"][0]["logprobs"]["tokens"]) == 24 and body["usage"]["truncated_tokens"] == 21


def test_what_echo_cannot_be_combined_with(server: tuple[ServerProcess, dict]) -> None:
    process, _ = server
    streamed = post(process, prompt="1+2=", echo=True, max_tokens=1, stream=True)
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "echo"
    nothing = post(process, prompt="1+2=", max_tokens=0)
    assert nothing.status_code == 400 and nothing.json()["error"]["param"] == "max_tokens"


def test_an_engine_that_cannot_score_answers_unsupported_parameter(module_dir: Path) -> None:
    (module_dir / "fake").mkdir(exist_ok=True)
    fake = start_fake_server(module_dir / "fake", fake_manifest())
    try:
        fake.wait_until("/ready", 200)
        body = {"model": "fake-model", "prompt": "x", "echo": True, "max_tokens": 1}
        answer = httpx.post(fake.url("/v1/completions"), json=body, timeout=30)
    finally:
        fake.stop()
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "unsupported_parameter"
    assert answer.json()["error"]["param"] == "echo"
