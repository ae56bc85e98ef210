"""Preprocess: chat templates, BOS, input limits and the truncation policies (dropped tokens reported)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servegate.contracts.errors import ServegateError, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.preprocess import Preprocessor, truncate
from servegate.runtime.types import GenerationRequest
from servegate.zoo.tokenizer import BOS_ID, build_char_tokenizer

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def served(**preprocess: object) -> ServedModel:
    return ServedModel.model_validate(
        {"name": "t", "weights": {"source": "zoo:tiny-primary"}, "preprocess": preprocess}
    )


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def encode(tokenizer, request: GenerationRequest, **preprocess: object):
    return Preprocessor(served(**preprocess), tokenizer).encode(request)


def text_of(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def test_prompt_gets_the_tokenizers_own_bos(tokenizer) -> None:
    out = encode(tokenizer, GenerationRequest(id="a", prompt="1+2="))
    assert out.token_ids == tokenizer("1+2=")["input_ids"] and out.token_ids[0] == BOS_ID
    assert out.truncated_tokens == 0


def test_plain_chat_template(tokenizer) -> None:
    messages = [{"role": "system", "content": "be short"}, {"role": "user", "content": "hi"}]
    out = encode(tokenizer, GenerationRequest(id="a", messages=messages), chat_template="none")
    assert text_of(tokenizer, out.token_ids) == "system: be short\nuser: hi"


def test_tokenizer_chat_template_without_a_second_bos(tokenizer) -> None:
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    out = encode(tokenizer, GenerationRequest(id="a", messages=[{"role": "user", "content": "hi"}]))
    assert out.token_ids[:2] != [BOS_ID, BOS_ID] and out.token_ids[0] == BOS_ID
    assert text_of(tokenizer, out.token_ids) == "<user>hi\n<assistant>"


def test_jinja_file_template_relative_to_the_manifest(tokenizer, tmp_path: Path) -> None:
    (tmp_path / "chat.jinja").write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}")
    manifest = tmp_path / "m.yaml"
    manifest.write_text("name: t\nweights: {source: zoo:tiny-primary}\npreprocess: {chat_template: chat.jinja}\n")
    from servegate.contracts.loading import load_manifest

    pre = Preprocessor(load_manifest(manifest), tokenizer)
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    out = pre.encode(GenerationRequest(id="a", messages=[{"role": "user", "content": parts}]))
    assert text_of(tokenizer, out.token_ids) == "[user] ab "


def test_missing_template_file_is_a_configuration_error(tokenizer) -> None:
    with pytest.raises(ServegateError, match="chat_template: cannot read"):
        Preprocessor(served(chat_template="/nonexistent/chat.jinja"), tokenizer)


def test_tokenizer_without_a_template_answers_the_client(tokenizer) -> None:
    with pytest.raises(ServingError) as err:
        encode(tokenizer, GenerationRequest(id="a", messages=[{"role": "user", "content": "hi"}]))
    assert err.value.code == "invalid_request" and "no chat template" in err.value.message


def test_reject_names_tokens_limit_and_param(tokenizer) -> None:
    with pytest.raises(ServingError) as err:
        encode(tokenizer, GenerationRequest(id="a", prompt="x" * 20), max_input_tokens=10)
    assert (err.value.code, err.value.param, err.value.status) == ("input_too_long", "prompt", 400)
    assert "21 tokens" in err.value.message and "at most 10" in err.value.message
    with pytest.raises(ServingError) as err:
        encode(tokenizer, GenerationRequest(id="a", messages=[{"role": "u", "content": "x" * 20}]), max_input_tokens=10)
    assert err.value.param == "messages"


@pytest.mark.parametrize(
    ("side", "kept"),
    [("left", "0123456789"[-7:]), ("right", "0123456"), ("middle", "0123789")],
)
def test_truncation_keeps_bos_and_reports_the_dropped_count(tokenizer, side: str, kept: str) -> None:
    out = encode(tokenizer, GenerationRequest(id="a", prompt="0123456789"), max_input_tokens=8, truncation=side)
    assert len(out.token_ids) == 8 and out.token_ids[0] == BOS_ID
    assert out.truncated_tokens == 3
    assert text_of(tokenizer, out.token_ids) == kept


def test_prompt_that_fits_is_untouched(tokenizer) -> None:
    out = encode(tokenizer, GenerationRequest(id="a", prompt="0123"), max_input_tokens=8, truncation="left")
    assert text_of(tokenizer, out.token_ids) == "0123" and out.truncated_tokens == 0


def test_token_ids_are_checked_and_truncated(tokenizer) -> None:
    out = encode(
        tokenizer, GenerationRequest(id="a", prompt_token_ids=[5, 6, 7, 8]), max_input_tokens=3, truncation="right"
    )
    assert (out.token_ids, out.truncated_tokens) == ([5, 6, 7], 1)
    from servegate.runtime.contract_layer import admit  # admission checks the ids, then the preprocessor encodes

    with pytest.raises(ServingError, match="prompt: token id 10000 is outside the vocabulary"):
        admit(served(), Preprocessor(served(), tokenizer), GenerationRequest(id="a", prompt_token_ids=[5, 10_000]))


def test_malformed_requests_are_client_errors(tokenizer) -> None:
    for request in (
        GenerationRequest(id="a"),
        GenerationRequest(id="a", prompt="x", messages=[{"role": "user", "content": "y"}]),
        GenerationRequest(id="a", messages=[{"content": "no role"}]),
        GenerationRequest(id="a", messages=[{"role": "user", "content": 3}]),
        GenerationRequest(id="a", messages=[]),
    ):
        with pytest.raises(ServingError) as err:
            encode(tokenizer, request, chat_template="none")
        assert err.value.code == "invalid_request" and err.value.spec.client_error


def test_truncate_edges() -> None:
    assert truncate([1, 2, 3, 4, 5], 3, "middle") == ([1, 2, 5], 2)
    assert truncate([9, 2, 3, 4, 5], 2, "left", keep_head=1) == ([9, 5], 3)
    assert truncate([9, 2, 3], 5, "left") == ([9, 2, 3], 0)
