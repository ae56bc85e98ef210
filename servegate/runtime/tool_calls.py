"""Tool calls read out of an output's text: under `auto` by the manifest's parser, under `required` and a named
choice as the JSON the grammar engine decoded; and, for a call that does not parse or breaks its function's
schema, what is wrong (failure_policy.on_invalid_output decides what the client gets).

The readings follow vLLM's: `hermes` takes each <tool_call>...</tool_call> (the last may be left open) as
{"name", "arguments"}, the text before the first tag is the content (None when empty), and the arguments are
written back with json.dumps(ensure_ascii=False); `required` reads [{"name", "parameters"}, ...]; a named choice
keeps the decoded arguments text as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema

from servegate.contracts.tool_fields import ToolUse


@dataclass(frozen=True)
class ToolCall:
    """One call read from the output."""

    name: str
    arguments: str
    """The arguments object as JSON text (OpenAI's shape)."""


@dataclass(frozen=True)
class ToolReading:
    """What an output says: its text content and its calls."""

    content: str | None
    """Text outside the calls (None: there is none)."""
    calls: tuple[ToolCall, ...] = ()
    problem: str | None = None
    """Why a call does not parse, names no offered function, or breaks its arguments schema (None: all fine).
    A call that does not parse leaves the whole output as content, with no calls (as vLLM)."""


HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


class _Unreadable(ValueError):
    """A call that cannot be read (the message says why)."""


def _hermes(use: ToolUse, text: str) -> ToolReading:
    start = text.find(HERMES_OPEN)
    if start < 0:
        return ToolReading(text)
    calls = []
    for number, (closed, open_ended) in enumerate(_HERMES_CALL.findall(text), start=1):
        body = _json(closed or open_ended, f"tool call {number}")
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or "arguments" not in body:
            raise _Unreadable(f"tool call {number} is not an object with a string name and arguments")
        calls.append(ToolCall(body["name"], json.dumps(body["arguments"], ensure_ascii=False)))
    return ToolReading(text[:start] or None, tuple(calls))


def _required(use: ToolUse, text: str) -> ToolReading:
    listed = _json(text, "tool_choice required")
    if not isinstance(listed, list) or not listed:
        raise _Unreadable("tool_choice required: the output is not a non-empty list of calls")
    calls = []
    for number, item in enumerate(listed, start=1):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or "parameters" not in item:
            raise _Unreadable(f"tool call {number} is not an object with a string name and parameters")
        calls.append(ToolCall(item["name"], json.dumps(item["parameters"], ensure_ascii=False)))
    return ToolReading(None, tuple(calls))


def _named(use: ToolUse, text: str) -> ToolReading:
    assert use.named is not None
    _json(text, f"the arguments of {use.named}")
    return ToolReading(None, (ToolCall(use.named, text),))


@dataclass(frozen=True)
class ToolParser:
    """How one family of chat templates writes calls into the text."""

    read: Callable[[ToolUse, str], ToolReading]
    """The content and calls of a finished output (raises _Unreadable)."""
    opening: str
    """The text that opens a call: streaming holds back what may begin it."""


PARSERS: dict[str, ToolParser] = {"hermes": ToolParser(_hermes, HERMES_OPEN)}
"""postprocess.tools.parser -> how an `auto` output is read (add a parser here, and its name to the manifest's
ToolParser)."""


def read_tool_calls(use: ToolUse, text: str) -> ToolReading:
    """The content and calls of a finished output under its ToolUse, with what is wrong with them, if anything."""
    reader = {"required": _required, "named": _named}.get(use.mode) or PARSERS[use.parser].read
    try:
        reading = reader(use, text)
    except _Unreadable as exc:
        return ToolReading(text, (), str(exc))
    for number, call in enumerate(reading.calls, start=1):
        problem = _call_problem(use, call, number)
        if problem is not None:
            return ToolReading(reading.content, reading.calls, problem)
    return reading


def _call_problem(use: ToolUse, call: ToolCall, number: int) -> str | None:
    schema = use.parameters(call.name)
    if schema is None:
        return f"tool call {number} calls {call.name}, which is not among the request's tools"
    arguments = json.loads(call.arguments)
    if not isinstance(arguments, dict):
        return f"tool call {number} ({call.name}): the arguments are not an object"
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(arguments))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"tool call {number} ({call.name}): {error.message}" + (f" at /{where}" if where else "")


def streamable_content(use: ToolUse | None, text: str) -> str:
    """The part of a growing output that is certainly content, so may stream as it comes: all of it without a
    ToolUse; under `auto`, the text before the first call's tag, less an end that may begin one; nothing under
    a forced choice (the whole output is the call)."""
    if use is None:
        return text
    if use.mode != "auto":
        return ""
    opening = PARSERS[use.parser].opening
    start = text.find(opening)
    if start >= 0:
        return text[:start]
    for keep in range(min(len(opening) - 1, len(text)), 0, -1):
        if opening.startswith(text[-keep:]):
            return text[:-keep]
    return text


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Unreadable(f"{what} is not JSON ({exc.msg} at character {exc.pos})") from None
