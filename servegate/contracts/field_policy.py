"""Which request fields outside servegate's API are accepted, dropped or refused, at every depth of the body.

Three lists decide, whatever the manifest's `preprocess.unknown_fields` says, before that policy applies:

- UNSUPPORTED: fields of the OpenAI API or of vLLM whose value changes the answer and that servegate does not
  implement (`best_of` would sample several completions, `suffix` would fill in text).
  Sent with their neutral value (`best_of: 1`, `suffix: ""`) they ask for nothing and pass; any other
  value is refused with `unsupported_parameter` (400), under every policy: dropping one would return a
  different answer than the one the client asked for, without a word.
- HARMLESS: metadata and extensions that cannot change the text, its tokens or its log-probabilities
  (`metadata`, `store`, `stream_options.continuous_usage_stats`, ...). `ignore` drops them; `reject` refuses
  them as unknown, saying that `ignore` would accept them.
- anything else is a field servegate has never heard of: `unknown_parameter` (400) under either policy, since
  servegate cannot tell whether dropping it would change the answer. Every field `ignore` drops is named in
  the `X-Servegate-Ignored-Fields` response header.

Paths are written as in error messages, with list positions as `[]`: `messages[].refusal`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from servegate.contracts.errors import ServingError

UNSUPPORTED: dict[str, tuple[tuple[str, ...], tuple[Any, ...], str]] = {
    # path: (endpoints, neutral values, what the field would do)
    "best_of": (("completions",), (None, 1), "best_of samples several completions and returns the likeliest"),
    "suffix": (("completions",), (None, ""), "suffix asks for text inserted before a given ending"),
    "functions": (("chat",), (None, []), "functions: OpenAI's deprecated spelling of tools (not in vLLM)"),
    "function_call": (("chat",), (None, "none"), "function_call: OpenAI's deprecated tool_choice (not in vLLM)"),
    "chat_template": (("tokenize",), (None,), "chat_template (vLLM) replaces the manifest's chat template"),
    "chat_template_kwargs": (
        ("tokenize",),
        (None, {}),
        "chat_template_kwargs (vLLM) changes the rendered prompt",
    ),
    "add_generation_prompt": (
        ("tokenize",),
        (None, True),
        "add_generation_prompt: false changes the rendered prompt",
    ),
    "continue_final_message": (
        ("tokenize",),
        (None, False),
        "continue_final_message changes the rendered prompt",
    ),
}
"""Answer-changing fields servegate does not implement: refused (unsupported_parameter) unless neutral."""

HARMLESS: dict[str, str] = {
    "metadata": "OpenAI: key-value tags stored with the request",
    "store": "OpenAI: whether the provider stores the completion",
    "service_tier": "OpenAI: the provider's processing tier",
    "prompt_cache_key": "OpenAI: a hint for the provider's prompt cache",
    "safety_identifier": "OpenAI: an end-user id for abuse detection",
    "request_id": "vLLM: the caller's own request id",
    "priority": "vLLM: scheduling priority (order only, not the answer)",
    "stream_options.continuous_usage_stats": "vLLM: usage in every chunk (guidellm sends it; the last chunk has it)",
    "stream_options.include_obfuscation": "OpenAI: random padding of stream chunks",
    "messages[].refusal": "OpenAI: a refusal text echoed back in an assistant message",
    "messages[].annotations": "OpenAI: citations echoed back in an assistant message",
}
"""Fields known to change nothing in the answer: dropped under `ignore`."""

_INDEX = re.compile(r"\[\d+\]")


def pattern_of(path: str) -> str:
    """A field path with list positions generalised: messages[2].refusal -> messages[].refusal."""
    return _INDEX.sub("[]", path)


def extra_fields(model: BaseModel, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every field outside the API, at every depth of a validated request."""
    for name, value in (model.model_extra or {}).items():
        yield (f"{path}.{name}" if path else name), value
    for name in type(model).model_fields:
        value = getattr(model, name)
        where = f"{path}.{name}" if path else name
        if isinstance(value, BaseModel):
            yield from extra_fields(value, where)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from extra_fields(item, f"{where}[{i}]")


def judge_extras(extras: list[tuple[str, Any]], endpoint: str, policy: str, allowed: set[str]) -> list[str]:
    """Refuse what must be refused (ServingError); return the paths dropped under the policy, in order.

    `allowed`: top-level names the manifest's input_schema declares (kept, and validated by that schema).
    """
    dropped: list[str] = []
    for path, value in extras:
        if path in allowed:
            continue
        pattern = pattern_of(path)
        spec = UNSUPPORTED.get(pattern)
        if spec is not None and endpoint in spec[0]:
            if any(value == neutral and type(value) is type(neutral) for neutral in spec[1]):
                continue
            detail = f"{spec[2]}, which servegate does not implement; leave '{path}' out"
            raise ServingError("unsupported_parameter", param=path, detail=detail)
        if pattern not in HARMLESS:  # what it would do is unknown, so dropping it is not known to be safe
            hint = "" if policy == "reject" else " (not known to be harmless, so not dropped: leave it out)"
            raise ServingError("unknown_parameter", param=path, hint=hint)
        if policy == "reject":
            hint = " (known to be harmless: preprocess.unknown_fields: ignore accepts and drops it)"
            raise ServingError("unknown_parameter", param=path, hint=hint)
        dropped.append(path)
    return dropped


def neutral_schema(endpoint: str) -> dict[str, dict[str, Any]]:
    """JSON Schema of the top-level UNSUPPORTED fields of an endpoint: only their neutral values."""
    return {
        path: {"enum": list(spec[1]), "description": f"Not implemented: {spec[2]}; only the neutral value passes."}
        for path, spec in UNSUPPORTED.items()
        if endpoint in spec[0] and "." not in path and "[" not in path
    }
