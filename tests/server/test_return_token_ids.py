"""vLLM's return_token_ids on the reference runtime (the zoo's tiny-primary): each choice carries the ids of the
tokens generated, as many as usage.completion_tokens counts (EOS and a cut stop string included), decoding to
its text; a stream's chunks carry the ids they deliver, adding up to the non-streamed answer's; without the field
no body carries the key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.manifests import real_manifest, write_manifest
from support.servers import ready_app
from transformers import AutoTokenizer

from servegate.contracts.loading import load_manifest
from servegate.zoo import zoo_model_path

COMPLETION = {"model": "tiny", "prompt": "12+34=", "max_tokens": 8, "temperature": 0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "12+34="}], "max_tokens": 8, "temperature": 0}
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    served = load_manifest(write_manifest(tmp_path_factory.mktemp("ids"), real_manifest("zoo:tiny-primary")))
    yield from ready_app(served)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(zoo_model_path("tiny-primary"))


def events(text: str) -> list[dict[str, Any]]:
    """The JSON events of a server-sent stream ([DONE] left out)."""
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def text_of(choice: dict[str, Any]) -> str:
    """A choice's (or a chunk choice's) text, completions or chat."""
    return choice.get("text") or (choice.get("message") or choice.get("delta") or {}).get("content") or ""


def plain(client: TestClient, endpoint: str, body: dict[str, Any]) -> tuple[str, list[int], int, str]:
    """(text, token_ids, usage.completion_tokens, finish_reason) of a non-streamed answer."""
    answer = client.post(PATHS[endpoint], json={**body, "return_token_ids": True})
    assert answer.status_code == 200, answer.text
    data = answer.json()
    (choice,) = data["choices"]
    return text_of(choice), choice["token_ids"], data["usage"]["completion_tokens"], choice["finish_reason"]


def streamed(client: TestClient, endpoint: str, body: dict[str, Any]) -> tuple[str, list[int], int, list[str]]:
    """(text, every chunk's token_ids joined, usage.completion_tokens, the chunks' texts) of a streamed answer."""
    asked = {**body, "return_token_ids": True, "stream": True, "stream_options": {"include_usage": True}}
    answer = client.post(PATHS[endpoint], json=asked)
    assert answer.status_code == 200, answer.text
    chunks = events(answer.text)
    choices = [c for chunk in chunks for c in chunk["choices"]]
    assert all("token_ids" in c for c in choices)  # every chunk of the choice says which tokens it delivers
    texts = [text_of(c) for c in choices]
    ids = [t for c in choices for t in c["token_ids"]]
    return "".join(texts), ids, chunks[-1]["usage"]["completion_tokens"], texts


@pytest.mark.parametrize("endpoint,body", [("completions", COMPLETION), ("chat", CHAT)])
def test_the_ids_are_every_token_generated_and_decode_to_the_text(
    client: TestClient, tokenizer: Any, endpoint: str, body: dict[str, Any]
) -> None:
    text, ids, completion_tokens, reason = plain(client, endpoint, body)
    assert text and len(ids) == completion_tokens
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    if reason == "stop":  # ended on EOS: generated, counted, never text
        assert ids[-1] == tokenizer.eos_token_id


@pytest.mark.parametrize("endpoint,body", [("completions", COMPLETION), ("chat", CHAT)])
def test_a_stream_delivers_the_same_ids_chunk_by_chunk(
    client: TestClient, tokenizer: Any, endpoint: str, body: dict[str, Any]
) -> None:
    whole_text, whole_ids, whole_count, _ = plain(client, endpoint, body)
    text, ids, completion_tokens, _ = streamed(client, endpoint, body)
    assert (text, ids, completion_tokens) == (whole_text, whole_ids, whole_count)
    assert len(ids) == completion_tokens
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


@pytest.mark.parametrize("endpoint,body", [("completions", COMPLETION), ("chat", CHAT)])
def test_a_cut_stop_string_keeps_its_tokens_in_the_ids(
    client: TestClient, tokenizer: Any, endpoint: str, body: dict[str, Any]
) -> None:
    full, _, _, _ = plain(client, endpoint, body)
    stop = full[1:3]  # held back while it may start the stop string, then cut from the text
    cut = {**body, "stop": [stop]}
    text, ids, completion_tokens, reason = plain(client, endpoint, cut)
    assert reason == "stop" and len(ids) == completion_tokens
    assert tokenizer.decode(ids, skip_special_tokens=True).startswith(text + stop)
    assert streamed(client, endpoint, cut)[:3] == (text, ids, completion_tokens)


def test_every_choice_of_several_prompts_carries_its_own_ids(client: TestClient) -> None:
    body = {**COMPLETION, "prompt": ["12+34=", "5+6="], "n": 2, "return_token_ids": True}
    data = client.post("/v1/completions", json=body).json()
    assert sum(len(c["token_ids"]) for c in data["choices"]) == data["usage"]["completion_tokens"]
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    chunks = events(client.post("/v1/completions", json=stream).text)
    by_index: dict[int, list[int]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            by_index.setdefault(choice["index"], []).extend(choice["token_ids"])
    assert [by_index[c["index"]] for c in data["choices"]] == [c["token_ids"] for c in data["choices"]]


def test_echo_answers_the_generated_ids(client: TestClient) -> None:
    body = {**COMPLETION, "echo": True, "return_token_ids": True}
    data = client.post("/v1/completions", json=body).json()
    (choice,) = data["choices"]
    assert len(choice["token_ids"]) == data["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("endpoint,body", [("completions", COMPLETION), ("chat", CHAT)])
def test_without_the_field_no_body_carries_token_ids(client: TestClient, endpoint: str, body: dict[str, Any]) -> None:
    data = client.post(PATHS[endpoint], json=body).json()
    assert all("token_ids" not in c for c in data["choices"])
    stream = client.post(PATHS[endpoint], json={**body, "stream": True}).text
    assert all("token_ids" not in c for chunk in events(stream) for c in chunk["choices"])


TOOLS_TEMPLATE = (
    "{%- if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
)
DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
ADD = {"type": "object", "properties": {"a": DIGIT, "b": DIGIT}, "required": ["a", "b"], "additionalProperties": False}


def test_a_streamed_tool_call_held_back_to_the_end_still_delivers_every_id(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    pytest.importorskip("llguidance")
    folder = tmp_path_factory.mktemp("tools")
    (folder / "tools.jinja").write_text(TOOLS_TEMPLATE)
    manifest = real_manifest(
        "zoo:tiny-primary",
        preprocess={"chat_template": "tools.jinja", "max_input_tokens": 128, "max_payload_bytes": 16384},
        runtime={"max_model_len": 256, "threads": 1, "kv_cache": {"block_size": 16, "memory_budget": "8MiB"}},
        postprocess={"max_output_tokens": 100, "structured_output": {"whitespace": "compact"}, "tools": {}},
    )
    tools = [{"type": "function", "function": {"name": "add", "parameters": ADD}}]
    body = {**CHAT, "max_tokens": 100, "tools": tools, "tool_choice": "required"}
    for tools_client in ready_app(load_manifest(write_manifest(folder, manifest))):
        _, whole_ids, count, reason = plain(tools_client, "chat", body)
        assert reason == "tool_calls" and len(whole_ids) == count
        assert streamed(tools_client, "chat", body)[1:3] == (whole_ids, count)
