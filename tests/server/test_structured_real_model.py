"""Structured output on a real instruct model: the openai client's `chat.completions.parse` with a pydantic model,
unmodified, against `gate serve` of SmolLM2-135M-Instruct (`make fetch`; skipped when it is not fetched)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pydantic
import pytest
from support.manifests import real_manifest
from support.servers import ServerProcess, start_gate_serve

from servegate.zoo import ZooError, zoo_model_path

NAME = "smollm2-135m-instruct"


class Person(pydantic.BaseModel):
    """What the model is asked to write."""

    name: str = pydantic.Field(max_length=24)
    age: int


@pytest.fixture(scope="module")
def client(module_dir: Path) -> Iterator[openai.OpenAI]:
    try:
        zoo_model_path(NAME)
    except ZooError:
        pytest.skip(f"zoo:{NAME} is not fetched: run `make fetch`")
    manifest = real_manifest(
        f"zoo:{NAME}",
        preprocess={"chat_template": "tokenizer", "max_input_tokens": 256, "max_payload_bytes": 16384},
        runtime={"max_model_len": 384, "threads": 2, "kv_cache": {"block_size": 16, "memory_budget": "64MiB"}},
        postprocess={"max_output_tokens": 64, "structured_output": {}},
    )
    manifest["name"] = "smol"
    process: ServerProcess = start_gate_serve(module_dir, manifest)
    process.wait_until("/ready", 200, timeout_s=240)
    yield openai.OpenAI(base_url=process.url("/v1"), api_key="unused", max_retries=0)
    assert process.stop() == 0


def test_the_parse_helper_gets_a_valid_object_from_a_real_instruct_model(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Invent a person. Answer with their name and age as JSON."}]
    completion = client.chat.completions.parse(
        model="smol",
        messages=messages,
        response_format=Person,
        max_tokens=64,
        temperature=0,  # type: ignore[arg-type]
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, Person) and choice.message.parsed.name
    unconstrained = client.chat.completions.create(model="smol", messages=messages, max_tokens=64, temperature=0)
    assert unconstrained.choices[0].message.content != choice.message.content  # the mask did something
    choice_answer = client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Is the sky blue? Answer yes or no."}],
        max_tokens=8,
        temperature=0,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert choice_answer.choices[0].message.content in ("yes", "no")
