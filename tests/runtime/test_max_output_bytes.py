"""postprocess.max_output_bytes: an answer longer than the limit is an invalid output, on the reference runtime."""

from __future__ import annotations

from typing import Any

import pytest

from servegate.contracts.manifest import ServedModel
from servegate.contracts.schema import manifest_json_schema
from servegate.runtime.postprocess import OutputValidator
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest, SamplingParams


def served(policy: str = "error", **post: Any) -> ServedModel:
    return ServedModel.model_validate({
        "name": "bytes",
        "weights": {"source": "zoo:tiny-primary"},
        "preprocess": {"chat_template": "none", "max_input_tokens": 96},
        "runtime": {"max_model_len": 128},
        "postprocess": {"max_output_tokens": 8, **post},
        "failure_policy": {"on_invalid_output": policy},
    })  # fmt: skip


def answer(manifest: ServedModel) -> FinishEvent | ErrorEvent:
    from servegate.runtime import build

    engine = build(manifest, fallback=False)
    try:
        [result] = engine.generate([GenerationRequest("r", prompt="123+456=", params=SamplingParams(max_tokens=8))])
    finally:
        engine.shutdown_sync(1.0)
    return result  # type: ignore[return-value]


def test_the_validator_counts_utf8_bytes_with_or_without_a_schema() -> None:
    assert OutputValidator(None, max_bytes=4).problem("abcd") is None
    over = OutputValidator(None, max_bytes=4).problem("abcdé")
    assert over == "the answer is 6 bytes, over postprocess.max_output_bytes 4"
    both = OutputValidator({"type": "object"}, max_bytes=64)
    assert both.problem("{}") is None and both.problem("[]") is not None


def test_an_answer_over_the_limit_is_refused_and_one_within_it_is_marked_valid() -> None:
    refused = answer(served(max_output_bytes=2))
    assert isinstance(refused, ErrorEvent) and refused.error.code == "invalid_output"
    assert "over postprocess.max_output_bytes 2" in str(refused.error.to_body())
    within = answer(served(max_output_bytes=64))
    assert isinstance(within, FinishEvent) and within.output_valid is True and within.text


def test_with_on_invalid_output_flag_the_answer_passes_marked_invalid() -> None:
    flagged = answer(served("flag", max_output_bytes=2))
    assert isinstance(flagged, FinishEvent) and flagged.output_valid is False


def test_the_field_is_documented_checked_and_left_out_of_the_fingerprint_when_unset() -> None:
    props = manifest_json_schema()["$defs"]["Postprocess"]["properties"]["max_output_bytes"]
    assert "UTF-8 bytes" in props["description"]
    with pytest.raises(ValueError, match="max_output_bytes"):
        served(max_output_bytes=0)
    assert served().fingerprint != served(max_output_bytes=64).fingerprint
    assert "max_output_bytes" not in served().six_elements()["postprocess"]
