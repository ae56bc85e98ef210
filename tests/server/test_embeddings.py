"""/v1/embeddings through the official client: both encodings, usage, and the errors of a wrong endpoint."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from conftest import ServerProcess, fake_manifest, start_fake_server

MODEL = "fake-model"


@pytest.fixture(scope="module")
def server(module_dir: Path) -> Iterator[ServerProcess]:
    """A server for a manifest with task: embed."""
    manifest = fake_manifest(preprocess={"task": "embed"}, postprocess={"logprobs": False})
    process = start_fake_server(module_dir, manifest)
    process.wait_until("/ready", 200)
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    """The official client, no retries."""
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)


def test_embeddings_through_the_openai_client_in_both_encodings(client: openai.OpenAI) -> None:
    texts = ["a short text", "another one"]
    packed = client.embeddings.create(model=MODEL, input=texts)  # the client asks for base64 by default
    plain = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in packed.data] == [0, 1]
    for a, b in zip(packed.data, plain.data, strict=True):
        assert len(a.embedding) == len(b.embedding) > 0
        assert all(
            math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6) for x, y in zip(a.embedding, b.embedding, strict=True)
        )
    assert packed.data[0].embedding != packed.data[1].embedding
    single = client.embeddings.create(model=MODEL, input="a short text", encoding_format="float")
    assert single.data[0].embedding == plain.data[0].embedding
    assert plain.usage.prompt_tokens == plain.usage.total_tokens >= 0


def test_embedding_errors_arrive_as_client_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as empty:
        client.embeddings.create(model=MODEL, input="")
    assert empty.value.param == "input"
    with pytest.raises(openai.BadRequestError) as dims:
        client.embeddings.create(model=MODEL, input="x", dimensions=3)
    assert dims.value.param == "dimensions"
    with pytest.raises(openai.BadRequestError) as wrong_task:
        client.completions.create(model=MODEL, prompt="x")
    assert wrong_task.value.param == "model" and "serves task embed" in wrong_task.value.message


def test_async_embeddings(server: ServerProcess) -> None:
    body = {"model": MODEL, "input": ["x"], "encoding_format": "float"}
    accepted = httpx.post(server.url("/v1/embeddings"), json=body, headers={"Prefer": "respond-async"})
    assert accepted.status_code == 202
    for _ in range(100):
        result = httpx.get(server.url(accepted.headers["Location"]))
        if result.status_code != 202:
            break
        time.sleep(0.05)
    assert result.status_code == 200 and result.json()["object"] == "list"
    direct = httpx.post(server.url("/v1/embeddings"), json=body).json()
    assert result.json()["data"] == direct["data"]
