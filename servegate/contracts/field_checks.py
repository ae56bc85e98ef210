"""The checks of request fields that two kinds of request share, each written once with its one message.

An API body is checked by `contracts/requests.parse_request`; a request built in code (a gate's probe, the
bench, a warm-up prompt, a library caller of the engine) skips the API, and `runtime/contract_layer.admit`
checks it with the functions here instead. So a bad value is refused in the same words whichever road it
took, and no field is checked twice on either road:

- `check_sampling`: the sampling fields' types and ranges, stated once as the chat API's pydantic fields;
- `check_min_tokens`, `check_logprobs_offered`: the rules across fields and against the manifest;
- `check_token_ids`: token ids (prompt, logit_bias, stop_token_ids) inside the loaded vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError, create_model
from pydantic_core import ErrorDetails

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.request_models import ChatCompletionRequest


def _is_union_tag(part: str) -> bool:
    """pydantic names union branches in error locations ('str', 'list[int]', 'TextPart'); they are not data."""
    return "[" in part or part[:1].isupper() or part in {"str", "int", "float", "bool", "none"}


def _data_path(data: Any, loc: tuple[Any, ...]) -> str:
    """The JSON path (`messages[0].content`) of an error location, following the data itself."""
    path, node = "", data
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and not _is_union_tag(part):
            node = None  # a missing field: name it and stop
        else:
            continue
        path = f"{path}[{part}]" if isinstance(part, int) else (f"{path}.{part}" if path else part)
        if node is None:
            break
    return path or "body"


def _as_sent(data: dict[str, Any], loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """An error location in the body as sent: a single prompt ("text" or [ids]) is parsed as a list of one."""
    prompt = data.get("prompt")
    single = isinstance(prompt, str) or (
        isinstance(prompt, list) and not any(isinstance(p, list | str) for p in prompt)
    )
    if loc[:2] == ("prompt", 0) and single:
        return loc[:1] + loc[2:]
    return loc


def _message(error: ErrorDetails, param: str) -> str:
    msg = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "missing":
        return f"'{param}' is required"
    shown = error.get("input")
    if isinstance(shown, bool | int | float) or shown is None:
        return f"{param}: {msg} (got {json.dumps(shown)})"
    return f"{param}: {msg}"


def validation_error(exc: ValidationError, data: dict[str, Any]) -> ServingError:
    """The catalogued error of a pydantic validation failure, naming the body's path at fault."""
    errors = exc.errors(include_url=False)
    # The first field's deepest error (for a union, the branch that matched the value's shape goes deepest:
    # a list content's bad part beats "should be a string").
    first = errors[0]["loc"][:1]
    deepest = max((e for e in errors if e["loc"][:1] == first), key=lambda e: len(e["loc"]))
    error = deepest
    param = _data_path(data, _as_sent(data, tuple(error["loc"])))
    return ServingError("invalid_request", param=param, detail=_message(error, param))


SAMPLING_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "min_tokens",
    "stop_token_ids",
    "top_logprobs",
)
"""The fields a request built in code carries in its SamplingParams and the API declares with a range."""


def _sampling_model() -> type[BaseModel]:
    """A model of the sampling fields with the chat API's own declarations (types, ranges, defaults)."""
    declared = ChatCompletionRequest.model_fields
    fields: dict[str, Any] = {name: (declared[name].annotation, declared[name]) for name in SAMPLING_FIELDS}
    return create_model("SamplingFields", **fields)


_SAMPLING = _sampling_model()


def check_sampling(values: Mapping[str, Any]) -> None:
    """Raise invalid_request, as the API words it, for a sampling field (SAMPLING_FIELDS) out of its range."""
    data = {name: list(value) if isinstance(value, tuple) else value for name, value in values.items()}
    try:
        _SAMPLING.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, data) from None


def check_min_tokens(min_tokens: int, most: int) -> None:
    """Raise invalid_request when min_tokens asks for more tokens than the request may generate (`most`)."""
    if min_tokens > most:
        detail = f"min_tokens: must be <= max_tokens ({most}) (got {min_tokens})"
        raise ServingError("invalid_request", param="min_tokens", detail=detail)


def check_logprobs_offered(served: ServedModel, param: str = "logprobs") -> None:
    """Raise invalid_request for a request of log-probabilities (`param`) where the manifest offers none."""
    if not served.postprocess.logprobs:
        detail = f"{param}: log-probabilities are not offered by this deployment"
        raise ServingError("invalid_request", param=param, detail=detail)


def check_token_ids(vocab_size: int, named: Mapping[str, Iterable[int]]) -> None:
    """Raise invalid_request for the first token id outside the vocabulary; `named` maps the field it came in
    (`prompt`, `prompt[1]`, `logit_bias`, `stop_token_ids`) to its ids."""
    for param, ids in named.items():
        outside = next((t for t in ids if not 0 <= t < vocab_size), None)
        if outside is not None:
            detail = f"{param}: token id {outside} is outside the vocabulary (ids 0 to {vocab_size - 1})"
            raise ServingError("invalid_request", param=param, detail=detail)


__all__ = [
    "SAMPLING_FIELDS",
    "check_logprobs_offered",
    "check_min_tokens",
    "check_sampling",
    "check_token_ids",
    "validation_error",
]
