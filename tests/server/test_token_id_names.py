"""vLLM's return_tokens_as_token_ids on the reference runtime (the zoo's tiny-primary): every logprob token and
every top alternative is named `token_id:<id>`, on both endpoints, streamed and not, naming the very tokens the
text-named answer names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from support.manifests import real_manifest, write_manifest
from support.servers import ready_app
from transformers import AutoTokenizer

from servegate.contracts.loading import load_manifest
from servegate.zoo import zoo_model_path

ID_NAME = re.compile(r"token_id:(\d+)")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    served = load_manifest(write_manifest(tmp_path_factory.mktemp("ids"), real_manifest("zoo:tiny-primary")))
    yield from ready_app(served)


def ids_of(names: list[str]) -> list[int]:
    found = [ID_NAME.fullmatch(n) for n in names]
    assert all(found), names
    return [int(f.group(1)) for f in found]  # type: ignore[union-attr]


def test_completion_logprobs_name_tokens_by_id(client: TestClient) -> None:
    tokenizer = AutoTokenizer.from_pretrained(zoo_model_path("tiny-primary"))
    body = {"model": "tiny", "prompt": "12+34=", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    by_text = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    by_id = client.post("/v1/completions", json={**body, "return_tokens_as_token_ids": True}).json()
    logprobs = by_id["choices"][0]["logprobs"]
    assert [tokenizer.decode([t]) for t in ids_of(logprobs["tokens"])] == by_text["tokens"]
    assert logprobs["token_logprobs"] == by_text["token_logprobs"]
    for tops, text_tops in zip(logprobs["top_logprobs"], by_text["top_logprobs"], strict=True):
        assert sorted(tops.values()) == sorted(text_tops.values()) and ids_of(list(tops))


def test_chat_logprobs_streamed_or_not_name_tokens_by_id(client: TestClient) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "12+34="}],
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "return_tokens_as_token_ids": True,
    }
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]["content"]
    names = [entry["token"] for entry in whole]
    ids_of(names)
    assert all(ids_of([alt["token"] for alt in entry["top_logprobs"]]) for entry in whole)
    streamed = client.post("/v1/chat/completions", json={**body, "stream": True}).text
    parts = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")]
    streamed_names = [
        e["token"] for p in parts for c in p["choices"] for e in (c.get("logprobs") or {}).get("content") or []
    ]
    assert streamed_names == names
