"""Structured output and tool calls on a real instruct model: the openai client's `chat.completions.parse` with a
pydantic model and its tool-calling flow, unmodified, against `gate serve` of SmolLM2-135M-Instruct behind
examples/tools/chatml-tools.jinja (`make fetch`; skipped when it is not fetched): a forced call comes back in
message.tool_calls, and the tool's result sent back as a `tool` message gets an answer in text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pydantic
import pytest
from support.manifests import real_manifest
from support.servers import ServerProcess, start_gate_serve

from servegate.zoo import ZooError, zoo_model_path

NAME = "smollm2-135m-instruct"
TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "tools" / "chatml-tools.jinja"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


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
        preprocess={"chat_template": str(TEMPLATE), "max_input_tokens": 512, "max_payload_bytes": 16384},
        runtime={"max_model_len": 640, "threads": 2, "kv_cache": {"block_size": 16, "memory_budget": "64MiB"}},
        batching={"max_num_batched_tokens": 640},
        postprocess={"max_output_tokens": 64, "structured_output": {"whitespace": "compact"}, "tools": {}},
    )
    manifest["name"] = "smol"
    manifest["failure_policy"]["request_timeout_s"] = 300  # what is tested is the answer, not the deadline
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


def test_the_openai_tool_calling_flow_on_a_real_instruct_model(client: openai.OpenAI) -> None:
    messages: list[dict[str, object]] = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    first = client.chat.completions.create(
        model="smol",
        messages=messages,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=64,
    )  # type: ignore[call-overload]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments["city"], str) and arguments["city"]
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees Celsius"})
    second = client.chat.completions.create(
        model="smol", messages=messages, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=48
    )  # type: ignore[call-overload]
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls
    streamed = client.chat.completions.create(
        model="smol",
        messages=messages[:1],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=64,
        stream=True,
    )  # type: ignore[call-overload]
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    [streamed_call] = [t for d in deltas for t in d.tool_calls or []]
    assert streamed_call.function.name == "get_weather" and json.loads(streamed_call.function.arguments or "")
