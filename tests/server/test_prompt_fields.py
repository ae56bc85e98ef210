"""vLLM's prompt-shaping request fields on the reference runtime (the zoo's tiny-primary): truncate_prompt_tokens
and truncation_side keep the tokens vLLM keeps and say how many were dropped; the chat-template fields render as
asked where the manifest's preprocess.template_fields allows them, and are refused where it does not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.manifests import real_manifest, write_manifest
from support.servers import ready_app
from transformers import AutoTokenizer

from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.runtime.preprocess import Preprocessor
from servegate.runtime.types import PromptOptions
from servegate.zoo import zoo_model_path

TEMPLATE = (
    "{% if greeting is defined %}{{ greeting }}\n{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if not (loop.last and continue_final_message) %}</>"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)
PROMPT = "the model 123+456=0579, 12+34=46, 1+1="
ALL_FIELDS = ["add_generation_prompt", "continue_final_message", "chat_template_kwargs", "chat_template"]


def served_in(folder: Path, fields: list[str]) -> ServedModel:
    (folder / "chat.jinja").write_text(TEMPLATE)
    manifest = real_manifest("zoo:tiny-primary", preprocess={"chat_template": "chat.jinja", "template_fields": fields})
    return load_manifest(write_manifest(folder, manifest))


def started(served: ServedModel) -> Iterator[TestClient]:
    yield from ready_app(served)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    yield from started(served_in(tmp_path_factory.mktemp("prompt-fields"), ALL_FIELDS))


def complete(client: TestClient, **fields: Any) -> Any:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, **fields}
    return client.post("/v1/completions", json=body)


def test_truncate_prompt_tokens_keeps_the_tokens_vllm_keeps_and_counts_the_rest(client: TestClient) -> None:
    tokenizer = AutoTokenizer.from_pretrained(zoo_model_path("tiny-primary"))
    ids = tokenizer(PROMPT)["input_ids"]
    for side, kept in ((None, ids[-12:]), ("right", ids[:12]), ("left", ids[-12:])):  # no side: vLLM's left
        asked = {"truncate_prompt_tokens": 12, **({"truncation_side": side} if side else {})}
        answer = complete(client, **asked).json()
        assert answer["usage"]["prompt_tokens"] == 12 and answer["usage"]["truncated_tokens"] == len(ids) - 12
        same = complete(client, prompt=kept).json()
        assert answer["choices"][0]["text"] == same["choices"][0]["text"], side
    whole = complete(client, truncate_prompt_tokens=-1).json()  # -1: max_input_tokens, which the prompt fits
    assert whole["usage"]["prompt_tokens"] == len(ids) and whole["usage"]["truncated_tokens"] == 0
    long = complete(client, prompt=PROMPT * 3, truncate_prompt_tokens=-1).json()
    dropped = len(tokenizer(PROMPT * 3)["input_ids"]) - 64
    assert long["usage"]["prompt_tokens"] == 64 and long["usage"]["truncated_tokens"] == dropped


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": 65}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"truncation_side": "left"}, "truncation_side"),
        ({"truncate_prompt_tokens": 4, "truncation_side": "middle"}, "truncation_side"),
    ],
)
def test_bad_truncation_fields_are_declared_400s(client: TestClient, fields: dict[str, Any], param: str) -> None:
    answer = complete(client, **fields)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text


def preprocessor(folder: Path) -> Preprocessor:
    return Preprocessor(served_in(folder, ALL_FIELDS), AutoTokenizer.from_pretrained(zoo_model_path("tiny-primary")))


def test_the_template_fields_render_as_vllm_passes_them(tmp_path: Path) -> None:
    pre = preprocessor(tmp_path)
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    assert pre.render_chat(turns) == "<user>hi</><assistant>Hel</><assistant>"
    assert pre.render_chat(turns, options=PromptOptions(add_generation_prompt=False)) == "<user>hi</><assistant>Hel</>"
    continued = PromptOptions(add_generation_prompt=False, continue_final_message=True)
    assert pre.render_chat(turns, options=continued) == "<user>hi</><assistant>Hel"
    greeted = PromptOptions(template_kwargs=(("greeting", "hey"),))
    assert pre.render_chat(turns[:1], options=greeted) == "hey\n<user>hi</><assistant>"
    own = PromptOptions(chat_template="{{ messages[0].content | upper }}")
    assert pre.render_chat(turns, options=own) == "HI"


def test_template_fields_reach_the_prompt_through_the_api(client: TestClient) -> None:
    def prompt_tokens(**fields: Any) -> int:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **fields}
        answer = client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        return int(answer.json()["usage"]["prompt_tokens"])

    plain = prompt_tokens()
    assert prompt_tokens(add_generation_prompt=False) == plain - len("<assistant>")
    assert prompt_tokens(chat_template_kwargs={"greeting": "hello"}) == plain + len("hello\n")
    assert prompt_tokens(chat_template="{{ messages[0].content }}") == len("hi") + (
        plain - len("<user>hi</><assistant>")
    )


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"add_generation_prompt": True, "continue_final_message": True}, "invalid_request", "continue_final_message"),
        ({"chat_template_kwargs": {"messages": []}}, "invalid_request", "chat_template_kwargs.messages"),
        ({"chat_template": "{% for %}"}, "invalid_request", "messages"),
    ],
)
def test_bad_template_fields_are_declared_400s(
    client: TestClient, fields: dict[str, Any], code: str, param: str
) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **fields}
    answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == code, answer.text
    assert answer.json()["error"]["param"] == param


def test_template_fields_the_manifest_does_not_name_are_refused(tmp_path: Path) -> None:
    for client in started(served_in(tmp_path, ["add_generation_prompt"])):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        assert client.post("/v1/chat/completions", json={**body, "add_generation_prompt": False}).status_code == 200
        assert client.post("/v1/chat/completions", json={**body, "add_generation_prompt": True}).status_code == 200
        for field, value in (
            ("chat_template", "x"),
            ("chat_template_kwargs", {"a": 1}),
            ("continue_final_message", True),
        ):
            answer = client.post("/v1/chat/completions", json={**body, field: value})
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "unsupported_parameter", field
            assert "preprocess.template_fields" in answer.json()["error"]["message"]
