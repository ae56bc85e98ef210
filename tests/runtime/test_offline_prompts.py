"""An offline input line is one request: the API's several prompts and n are refused there, by name."""

from __future__ import annotations

import pytest

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.offline import InputLine, to_generation_request

SERVED = ServedModel.model_validate({"name": "m", "weights": {"source": "zoo:tiny-primary"}})


@pytest.mark.parametrize(("data", "param"), [({"prompt": ["a", "b"]}, "prompt"), ({"prompt": "a", "n": 2}, "n")])
def test_a_line_with_several_answers_is_refused(data: dict[str, object], param: str) -> None:
    with pytest.raises(ServingError) as caught:
        to_generation_request(SERVED, InputLine(line=1, id="1", data=data))
    assert caught.value.param == param and "one line per prompt" in caught.value.message


def test_every_single_prompt_form_still_runs() -> None:
    assert to_generation_request(SERVED, InputLine(line=1, id="1", data={"prompt": ["a"]})).prompt == "a"
    ids = to_generation_request(SERVED, InputLine(line=2, id="2", data={"prompt": [[5, 6]]}))
    assert ids.prompt_token_ids == [5, 6]
