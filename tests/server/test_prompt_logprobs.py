"""`prompt_logprobs` (vLLM) against `gate serve` on the reference engine: every prompt token's log-probability
and vocabulary rank with its likeliest alternatives, in a completion choice and at a chat completion's top level;
the answer itself unchanged; refused with a declared 400 where it cannot be served, and by `gate run`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.manifests import real_manifest
from support.servers import ServerProcess, start_gate_serve

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.requests import parse_request
from servegate.runtime import build
from servegate.runtime.engine.offline import InputLine, to_generation_request
from servegate.runtime.types import GenerationRequest

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"


def manifest_for(weights: str, folder: Path) -> dict[str, Any]:
    (folder / "chat.jinja").write_text(TEMPLATE)
    return real_manifest(weights, preprocess={"chat_template": str(folder / "chat.jinja")})


@pytest.fixture(scope="module")
def server(module_dir: Path, weights_source: str) -> Iterator[tuple[ServerProcess, dict[str, Any]]]:
    manifest = manifest_for(weights_source, module_dir)
    process = start_gate_serve(module_dir, manifest)
    process.wait_until("/ready", 200, timeout_s=240)
    yield process, manifest
    assert process.stop() == 0


def post(server: ServerProcess, path: str = "/v1/completions", **body: object) -> httpx.Response:
    return httpx.post(server.url(path), json={"model": "tiny", **body}, timeout=60)


def check_entries(entries: list[Any], prompt_tokens: int, top: int) -> None:
    """vLLM's shape: null first, then the prompt's own token first with its rank, then ranked alternatives."""
    assert len(entries) == prompt_tokens and entries[0] is None
    for entry in entries[1:]:
        own, *alternatives = entry.items()
        assert len(alternatives) in (top - 1, top) and own[1]["rank"] >= 1
        assert [a[1]["rank"] for a in alternatives] == sorted(a[1]["rank"] for a in alternatives)
        values = [v["logprob"] for _, v in alternatives]
        assert values == sorted(values, reverse=True)
        if own[1]["rank"] <= top:  # the token is among the alternatives: its rank is its place among them
            ranked = sorted(entry.items(), key=lambda kv: -kv[1]["logprob"])
            assert ranked[own[1]["rank"] - 1][0] == own[0]
        else:
            assert len(alternatives) == top and own[1]["logprob"] < min(values)


def test_a_completion_carries_each_prompt_tokens_logprob_and_rank(server: tuple[ServerProcess, dict]) -> None:
    process, manifest = server
    plain = post(process, prompt="796+439=", max_tokens=4, temperature=0).json()
    answer = post(process, prompt="796+439=", max_tokens=4, temperature=0, prompt_logprobs=3)
    assert answer.status_code == 200, answer.text
    [choice] = answer.json()["choices"]
    assert choice["text"] == plain["choices"][0]["text"] and "prompt_logprobs" not in plain["choices"][0]
    check_entries(choice["prompt_logprobs"], answer.json()["usage"]["prompt_tokens"], 3)
    engine = build(ServedModel.model_validate(manifest))
    try:
        [scored] = engine.score([GenerationRequest("x", prompt="796+439=")])
    finally:
        engine.shutdown_sync()
    own = [next(iter(entry.values())) for entry in choice["prompt_logprobs"][1:]]
    assert [int(next(iter(e))) for e in choice["prompt_logprobs"][1:]] == list(scored.token_ids[1:])
    assert [o["logprob"] for o in own] == pytest.approx(list(scored.logprobs[1:]), abs=1e-5)
    assert [o["rank"] == 1 for o in own] == list(scored.greedy[1:])  # rank 1 exactly where it was the argmax
    assert [o["decoded_token"] for o in own] == list("796+439=")


def test_choices_share_their_prompts_entries_and_zero_asks_for_the_token_alone(
    server: tuple[ServerProcess, dict],
) -> None:
    process, _ = server
    body = post(process, prompt=["1+2=", "30+4="], n=2, max_tokens=2, temperature=0, prompt_logprobs=0).json()
    choices = body["choices"]
    assert choices[0]["prompt_logprobs"] == choices[1]["prompt_logprobs"] != choices[2]["prompt_logprobs"]
    assert all(len(e) == 1 for c in choices for e in c["prompt_logprobs"][1:])


def test_a_chat_completion_scores_the_rendered_prompt(server: tuple[ServerProcess, dict]) -> None:
    process, _ = server
    messages = [{"role": "user", "content": "1+2="}]
    answer = post(process, "/v1/chat/completions", messages=messages, max_tokens=2, prompt_logprobs=2)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    check_entries(body["prompt_logprobs"], body["usage"]["prompt_tokens"], 2)
    rendered = "".join(next(iter(e.values()))["decoded_token"] for e in body["prompt_logprobs"][1:])
    assert rendered == "<user>1+2=\n<assistant>"  # the template's text, as the model saw it
    named = post(process, "/v1/chat/completions", messages=messages, max_tokens=1, prompt_logprobs=1,
                 return_tokens_as_token_ids=True).json()  # fmt: skip
    assert all(v["decoded_token"] == f"token_id:{k}" for e in named["prompt_logprobs"][1:] for k, v in e.items())


def test_what_prompt_logprobs_cannot_be_combined_with(server: tuple[ServerProcess, dict]) -> None:
    process, manifest = server
    streamed = post(process, prompt="1+2=", max_tokens=1, stream=True, prompt_logprobs=1)
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "prompt_logprobs"
    too_many = post(process, prompt="1+2=", max_tokens=1, prompt_logprobs=21)
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "prompt_logprobs"
    closed = ServedModel.model_validate({**manifest, "postprocess": {**manifest["postprocess"], "logprobs": False}})
    with pytest.raises(ServingError, match="log-probabilities are not offered") as refused:
        parse_request(closed, "completions", {"model": "tiny", "prompt": "1", "prompt_logprobs": 1})
    assert refused.value.param == "prompt_logprobs"
    with pytest.raises(ServingError, match="score prompts over HTTP") as offline:
        to_generation_request(
            ServedModel.model_validate(manifest), InputLine(1, "a", {"prompt": "1", "prompt_logprobs": 1})
        )
    assert offline.value.code == "unsupported_parameter"


def test_echo_and_prompt_logprobs_read_one_scoring_of_the_prompt(server: tuple[ServerProcess, dict]) -> None:
    process, _ = server
    both = post(process, prompt="796+439=", echo=True, logprobs=1, max_tokens=0, prompt_logprobs=2).json()
    [choice] = both["choices"]
    echoed = choice["logprobs"]["token_logprobs"]
    own = [next(iter(entry.values()))["logprob"] for entry in choice["prompt_logprobs"][1:]]
    assert choice["prompt_logprobs"][0] is None and echoed[0] is None
    assert own == pytest.approx(echoed[1:], abs=1e-6)  # the same prompt tokens, the same values
    assert all(len(entry) in (2, 3) for entry in choice["prompt_logprobs"][1:])  # 2 alternatives, not echo's 1
    assert all(len(top) == 1 for top in choice["logprobs"]["top_logprobs"][1:])  # echo keeps its own 1
