"""The streaming check counts the token ids a server sent, never re-tokenized text, where it has them.

The defect this guards: `gate check examples/smollm2/manifest.yaml` failed its load gate with "usage.completion_tokens
is 64, the stream carried 62 token(s)" because the tokens received were counted by re-tokenizing the answer's text,
and a real BPE model's generated tokens (code with runs of whitespace, each space its own token) re-tokenize into
fewer. servegate's server now answers `return_token_ids`, HttpTarget asks it for them, and the check counts them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.gates.probes.http_target import Answer, HttpTarget
from servegate.gates.probes.stream_checks import streaming_consistency
from servegate.zoo import ZooError, zoo_model_path

SMOLLM2 = Path(__file__).resolve().parents[3] / "examples" / "smollm2" / "manifest.yaml"
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def smollm2() -> HttpTarget:
    try:
        zoo_model_path("smollm2-135m-instruct")
    except ZooError:
        pytest.skip("zoo:smollm2-135m-instruct is not fetched: run `make fetch`")
    return HttpTarget(load_manifest(SMOLLM2), client=None, label="test")  # type: ignore[arg-type]  # counts only


def generated_code(target: HttpTarget) -> list[int]:
    """64 token ids as a model generates indented code: a newline, each space of the indent its own token, then
    a word; the manifest's tokenizer writes a run of spaces as one token."""
    from servegate.runtime.model.weights import load_tokenizer

    tokenizer = load_tokenizer(target.served)

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    line = ids("\n") + ids(" ") * 8 + ids("return")
    return (line * (MAX_TOKENS // len(line) + 1))[:MAX_TOKENS]


def answers(target: HttpTarget, ids: list[int], with_ids: bool) -> tuple[Answer, Answer]:
    """The streamed answer (a chunk per token) and its non-streamed twin, cut at max_tokens, usage as generated."""
    from servegate.runtime.model.weights import load_tokenizer

    tokenizer = load_tokenizer(target.served)
    chunks = tuple(tokenizer.decode([t]) for t in ids)
    common: dict[str, Any] = {
        "max_tokens": MAX_TOKENS,
        "status": 200,
        "text": "".join(chunks),
        "token_ids": tuple(ids) if with_ids else None,
        "finish_reasons": ("length",),
        "completion_tokens": len(ids),
    }
    return Answer(stream=True, chunks=chunks, **common), Answer(stream=False, **common)


def test_generated_ids_that_re_tokenize_into_fewer_are_no_usage_miscount(smollm2: HttpTarget) -> None:
    ids = generated_code(smollm2)
    streamed, plain = answers(smollm2, ids, with_ids=True)
    assert smollm2.tokens_received(plain) == MAX_TOKENS
    measured, problems = streaming_consistency(
        [("humaneval/HumanEval/5", streamed, plain)], [], smollm2.tokens_received, concurrency=2
    )
    assert problems == [] and measured.usage_miscounts == 0 and measured.token_count == "token ids"


def test_re_tokenized_text_is_what_miscounted(smollm2: HttpTarget) -> None:
    """The defect as it was: the same answers without ids, counted by re-tokenizing their text."""
    streamed, plain = answers(smollm2, generated_code(smollm2), with_ids=False)
    assert smollm2.tokens_received(plain) < MAX_TOKENS  # the premise: re-tokenizing is not the inverse
    measured, problems = streaming_consistency([("item", streamed, plain)], [], smollm2.tokens_received, concurrency=2)
    assert measured.usage_miscounts == 2 and measured.token_count == "tokenizer"
    assert "usage.completion_tokens is 64, the stream carried" in problems[0]


SERVED = ServedModel.model_validate({"name": "m", "weights": {"source": "zoo:tiny-primary"}})


def test_servegate_s_app_is_asked_for_the_token_ids() -> None:
    target = HttpTarget(SERVED, client=None, label="test")  # type: ignore[arg-type]
    for stream in (False, True):
        assert target.body("1+2=", 8, stream)["return_token_ids"] is True


def test_ids_are_counted_exactly_even_when_the_answer_ended_on_stop() -> None:
    """Ids are every token generated, EOS included: usage one more than the ids is a miscount, with no slack."""
    target = HttpTarget(SERVED, client=None, label="test")  # type: ignore[arg-type]
    counted = Answer(False, 8, 200, "12", token_ids=(5, 6, 2), finish_reasons=("stop",), completion_tokens=3)
    over = Answer(False, 8, 200, "12", token_ids=(5, 6, 2), finish_reasons=("stop",), completion_tokens=4)
    measured, problems = streaming_consistency([], [("a", counted), ("b", over)], target.tokens_received,
                                               concurrency=2)  # fmt: skip
    assert measured.usage_miscounts == 1 and problems[0].startswith("b: usage.completion_tokens is 4")
