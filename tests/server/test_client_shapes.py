"""The API as lm-eval, guidellm and vLLM clients send it: every prompt form, several choices, n, streams of
several choices, the tokenizer routes, cache marks, sampling without a seed, logprob token names.

One `gate serve` on the reference engine (tiny model, response cache on, logprobs offered) for the module;
policy variants run on the fake engine (tests/support/fault_engine.py), which starts in a second.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.manifests import fake_manifest, real_manifest
from support.servers import ServerProcess, start_gate_serve

MODEL = "tiny"


@pytest.fixture(scope="module")
def server(module_dir: Path, weights_source: str) -> Iterator[ServerProcess]:
    """`gate serve`: no tenants, response cache on, logprobs offered, up to 16 choices per request."""
    manifest = real_manifest(weights_source, postprocess={"response_cache": {"enabled": True}})
    process = start_gate_serve(module_dir, manifest)
    process.wait_until("/ready", 200, timeout_s=240)
    yield process
    assert process.stop() == 0


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url(path), json=body, timeout=60)


def _complete(server: ServerProcess, **body: Any) -> dict[str, Any]:
    response = _post(server, "/v1/completions", {"model": MODEL, "max_tokens": 6, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_every_prompt_form_is_answered_choice_by_choice_in_prompt_order(server: ServerProcess) -> None:
    ids = _post(server, "/tokenize", {"prompt": "12+30=", "add_special_tokens": False}).json()["tokens"]
    alone = [_complete(server, prompt=p)["choices"][0]["text"] for p in ("12+30=", "7+8=")]
    as_list = _complete(server, prompt=["12+30=", "7+8="])
    assert [c["index"] for c in as_list["choices"]] == [0, 1]
    assert [c["text"] for c in as_list["choices"]] == alone
    as_ids = _complete(server, prompt=ids)["choices"][0]["text"]
    as_id_lists = _complete(server, prompt=[ids, ids])  # lm-eval's default: tokenized, several per request
    assert [c["text"] for c in as_id_lists["choices"]] == [as_ids, as_ids]
    single = _complete(server, prompt=ids)["usage"]
    assert as_id_lists["usage"]["prompt_tokens"] == 2 * single["prompt_tokens"]


def test_n_choices_sample_apart_and_repeat_with_their_seed(server: ServerProcess) -> None:
    ask = {"prompt": "12+", "n": 3, "temperature": 1.5, "seed": 11, "max_tokens": 12, "ignore_eos": True}
    first = _complete(server, **ask)
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert len({c["text"] for c in first["choices"]}) > 1  # choice i samples with seed + i
    assert _complete(server, **ask)["choices"] == first["choices"]


def test_a_stream_of_several_prompts_names_each_chunks_choice(server: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": ["12+30=", "7+8="], "max_tokens": 6, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    whole = _complete(server, prompt=["12+30=", "7+8="])
    texts = ["", ""]
    finished: list[int] = []
    usage = None
    with httpx.stream("POST", server.url("/v1/completions"), json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if not chunk["choices"]:
                usage = chunk["usage"]
                continue
            choice = chunk["choices"][0]
            texts[choice["index"]] += choice["text"]
            if choice["finish_reason"] is not None:
                finished.append(choice["index"])
    assert texts == [c["text"] for c in whole["choices"]]
    assert sorted(finished) == [0, 1]
    assert usage is not None and usage["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_sampling_without_a_seed_draws_afresh(server: ServerProcess) -> None:
    ask = {"prompt": "12+", "temperature": 1.5, "max_tokens": 16, "ignore_eos": True}
    texts = {_complete(server, **ask)["choices"][0]["text"] for _ in range(3)}
    assert len(texts) > 1
    greedy = {_complete(server, prompt="1", max_tokens=8)["choices"][0]["text"] for _ in range(2)}
    assert len(greedy) == 1


def test_a_cache_hit_is_marked_in_the_header_and_the_body(server: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": "99+1=", "max_tokens": 5, "temperature": 0}
    first = _post(server, "/v1/completions", body)
    again = _post(server, "/v1/completions", body)
    assert (first.headers["X-Servegate-Cache"], first.json()["response_cache"]) == ("miss", "miss")
    assert (again.headers["X-Servegate-Cache"], again.json()["response_cache"]) == ("hit", "hit")
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    with httpx.stream("POST", server.url("/v1/completions"), json={**body, "stream": True}, timeout=60) as stream:
        assert stream.headers["X-Servegate-Cache"] == "hit"
        chunks = [json.loads(x[6:]) for x in stream.iter_lines() if x.startswith("data: {")]
    assert all(c["response_cache"] == "hit" for c in chunks)


def test_logprob_tokens_are_named_as_their_top_alternatives_name_them(server: ServerProcess) -> None:
    result = _complete(server, prompt="12+34=", max_tokens=12, logprobs=1)["choices"][0]
    logprobs = result["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"])
    for token, top in zip(logprobs["tokens"], logprobs["top_logprobs"], strict=True):
        assert token in top  # greedy: the chosen token is the top alternative, under the same name
    info = httpx.get(server.url("/tokenizer_info"), timeout=10).json()
    if result["finish_reason"] == "stop":  # ended on EOS: shown as the tokenizer writes it, in both
        assert logprobs["tokens"][-1] == info["eos_token"]


def _stream(server: ServerProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", server.url(path), json={**body, "stream": True}, timeout=60) as stream:
        assert stream.status_code == 200
        return [json.loads(x[6:]) for x in stream.iter_lines() if x.startswith("data: {")]


def test_a_stream_carries_each_tokens_logprobs_as_the_whole_answer_does(server: ServerProcess) -> None:
    """Streamed, logprobs came back null (an endpoint in front of servegate then had none to pass on)."""
    body = {"model": MODEL, "prompt": "503+96=", "max_tokens": 12, "temperature": 0, "logprobs": 2}
    parts = [c["choices"][0]["logprobs"] for c in _stream(server, "/v1/completions", body) if c["choices"]]
    whole = _complete(server, **body)["choices"][0]["logprobs"]  # the response cache replays the streamed one
    streamed = {k: [v for p in parts if p for v in p[k]] for k in whole}
    assert streamed == whole and len(whole["tokens"]) > 0
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "7+8="}], "max_tokens": 8, "temperature": 0,
            "logprobs": True, "top_logprobs": 1}  # fmt: skip
    pieces = [c["choices"][0]["logprobs"] for c in _stream(server, "/v1/chat/completions", chat) if c["choices"]]
    answer = _post(server, "/v1/chat/completions", chat).json()["choices"][0]["logprobs"]["content"]
    assert [e for p in pieces if p for e in p["content"]] == answer and answer


def test_tokenizer_routes_answer_as_vllm_shapes_them(server: ServerProcess) -> None:
    info = httpx.get(server.url("/tokenizer_info"), timeout=10)
    assert info.status_code == 200
    fields = info.json()
    assert fields["eos_token"] and fields["tokenizer_class"] and fields["model_max_length"] == 128
    assert not any("path" in key or key.endswith("_file") for key in fields)
    plain = _post(server, "/tokenize", {"model": MODEL, "prompt": "12+30=", "return_token_strs": True}).json()
    assert set(plain) == {"count", "max_model_len", "tokens", "token_strs"}
    assert plain["count"] == len(plain["tokens"]) == len(plain["token_strs"]) and plain["max_model_len"] == 128
    bare = _post(server, "/tokenize", {"prompt": "12+30=", "add_special_tokens": False}).json()
    assert bare["token_strs"] is None and bare["tokens"] == plain["tokens"][-len(bare["tokens"]) :]
    eos = _post(server, "/tokenize", {"prompt": fields["eos_token"], "add_special_tokens": False}).json()["tokens"]
    assert len(eos) == 1  # lm-eval finds the EOS id this way
    back = _post(server, "/detokenize", {"model": MODEL, "tokens": bare["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": "12+30="}
    chat = _post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200 and chat.json()["count"] > 2
    wrong = _post(server, "/tokenize", {"model": "other", "prompt": "x"})
    assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"
    out_of_vocab = _post(server, "/detokenize", {"tokens": [1, 10**6]})
    assert out_of_vocab.status_code == 400 and out_of_vocab.json()["error"]["param"] == "tokens[1]"
    not_json = httpx.post(server.url("/tokenize"), content=b"prompt=x", timeout=10)
    assert not_json.status_code == 415


# --- policies, on the fake engine ----------------------------------------------------------------------------

GUIDELLM_BODY = {
    "model": "fake-model",
    "prompt": "hello there",
    "max_tokens": 4,
    "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
}


def test_guidellms_stream_options_pass_under_ignore_and_are_named(server_factory: Any) -> None:
    lenient = server_factory(fake_manifest(preprocess={"unknown_fields": "ignore"}))
    strict = server_factory(fake_manifest())
    lenient.wait_until("/ready", 200)
    strict.wait_until("/ready", 200)
    answer = httpx.post(lenient.url("/v1/completions"), json=GUIDELLM_BODY, timeout=30)
    assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
    assert answer.headers["X-Servegate-Ignored-Fields"] == "stream_options.continuous_usage_stats"
    refused = httpx.post(strict.url("/v1/completions"), json=GUIDELLM_BODY, timeout=30)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "unknown_parameter" and "unknown_fields: ignore" in error["message"]
    odd = httpx.post(
        lenient.url("/v1/completions"),
        json={**GUIDELLM_BODY, "stream": False, "stream_options": None, "a\nSet-Cookie: x": 1, "caf\u00e9": 2},
        timeout=30,
    )
    # fields servegate has never heard of are not known to be harmless: refused, never dropped (nor echoed in a header)
    assert odd.status_code == 400 and odd.json()["error"]["code"] == "unknown_parameter"
    assert "set-cookie" not in odd.headers and "X-Servegate-Ignored-Fields" not in odd.headers
    echo = {"model": "fake-model", "prompt": "x", "echo": True, "logprobs": 1, "max_tokens": 1}
    for target in (lenient, strict):  # lm-eval's log-likelihood request: never silently answered without echo
        response = httpx.post(target.url("/v1/completions"), json=echo, timeout=30)
        assert response.status_code == 400 and response.json()["error"]["code"] == "unsupported_parameter"


def test_deterministic_sampling_is_a_declared_choice(server_factory: Any) -> None:
    declared = server_factory(fake_manifest(preprocess={"unseeded_sampling": "deterministic"}))
    default = server_factory(fake_manifest())
    declared.wait_until("/ready", 200)
    default.wait_until("/ready", 200)
    body = {"model": "fake-model", "prompt": "abc", "max_tokens": 12, "temperature": 1.0}

    def texts(target: ServerProcess) -> set[str]:
        return {
            httpx.post(target.url("/v1/completions"), json=body, timeout=30).json()["choices"][0]["text"]
            for _ in range(3)
        }

    assert len(texts(declared)) == 1
    assert len(texts(default)) > 1


def test_choices_past_the_manifest_limit_are_refused(server_factory: Any) -> None:
    target = server_factory(fake_manifest(preprocess={"max_choices_per_request": 2}))
    target.wait_until("/ready", 200)
    ok = httpx.post(target.url("/v1/completions"), json={"model": "fake-model", "prompt": ["a", "b"]}, timeout=30)
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2
    body = {"model": "fake-model", "prompt": ["a", "b"], "n": 2}
    refused = httpx.post(target.url("/v1/completions"), json=body, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
