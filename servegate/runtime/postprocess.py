"""Tokens -> text the client sees: incremental detokenization, stop conditions, output-schema checks.

One `OutputStream` per request turns each sampled token into a text delta. Stop strings are trimmed
even when they span tokens: the last (longest stop - 1) characters are held back from streaming until
it is certain they do not begin a stop string. EOS is never part of the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import jsonschema

from servegate.contracts.constraint_fields import OutputConstraint
from servegate.contracts.tool_fields import ToolUse
from servegate.runtime.tool_calls import read_tool_calls

FinishReason = Literal["stop", "length", "eos"]

# Prompt tokens decoded in front of the output so the first output token gets its leading space right
# (SentencePiece drops a word's leading space at the start of a decode).
_CONTEXT_TOKENS = 6


class Detokenizer(Protocol):
    """The part of a Hugging Face tokenizer postprocess needs."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str:
        """Token ids to text."""


@dataclass
class Delta:
    """What one new token changes for the client."""

    text: str
    """Text that may be streamed now (stop strings and their possible beginnings held back)."""
    finish_reason: FinishReason | None = None
    """Set when this token ends the request."""


@dataclass
class OutputStream:
    """One request's output: token ids, text, stop conditions."""

    tokenizer: Detokenizer
    max_tokens: int
    stop: tuple[str, ...] = ()
    eos_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    prompt_token_ids: Sequence[int] = ()
    stop_token_ids: frozenset[int] = frozenset()
    """Ids that end the output besides EOS (finish_reason stop; kept in token_ids, not in the text)."""
    min_tokens: int = 0
    """Tokens generated before EOS, a stop token id or a stop string may end the output (as vLLM)."""
    include_stop: bool = False
    """Keep the stop string that ended the output at the end of its text (vLLM's include_stop_str_in_output)."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the text (EOS and the stop token ids never enter it)."""
    token_ids: list[int] = field(default_factory=list)
    """Every sampled token, EOS included."""
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    """The output text so far (trimmed at a stop string once one is found)."""
    finish_reason: FinishReason | None = None
    _ids: list[int] = field(default_factory=list)
    _prefix: int = 0
    _read: int = 0
    _streamed: int = 0

    def __post_init__(self) -> None:
        context = list(self.prompt_token_ids[-_CONTEXT_TOKENS:])
        self._ids = context
        self._prefix, self._read = 0, len(context)
        self._holdback = max((len(s) for s in self.stop), default=1) - 1

    def add(self, token_id: int, logprob: float | None = None) -> Delta:
        """Append one sampled token; returns the streamable text delta and, if it ends the request, why."""
        if self.finish_reason is not None:
            raise RuntimeError("a token was added after the output finished")
        self.token_ids.append(token_id)
        if logprob is not None:
            self.logprobs.append(logprob)
        may_end = len(self.token_ids) > self.min_tokens
        if may_end and token_id in self.stop_token_ids:
            self.finish_reason = "stop"
        elif may_end and token_id in self.eos_token_ids and not self.ignore_eos:
            self.finish_reason = "eos"
        else:
            self._ids.append(token_id)
            self.text += self._decode_new()
            if self.stop and may_end and self._trim_stop():
                self.finish_reason = "stop"
        if self.finish_reason is None and len(self.token_ids) >= self.max_tokens:
            self.finish_reason = "length"
        return Delta(self._stream(), self.finish_reason)

    def ending_ids(self) -> frozenset[int]:
        """The ids that would end the output: the stop token ids, and EOS unless ignore_eos."""
        return self.stop_token_ids if self.ignore_eos else self.stop_token_ids | self.eos_token_ids

    def _decode_new(self) -> str:
        """Text added by the newest token; empty while it is an incomplete character (U+FFFD)."""
        skip = self.skip_special_tokens
        before = self.tokenizer.decode(self._ids[self._prefix : self._read], skip_special_tokens=skip)
        after = self.tokenizer.decode(self._ids[self._prefix :], skip_special_tokens=skip)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]

    def _trim_stop(self) -> bool:
        # Only the tail can hold a new match: text before it was searched on earlier tokens.
        start = max(0, self._streamed - self._holdback - 1)
        self.text, found = cut_at_stop(self.text, self.stop, start, keep=self.include_stop)
        return found

    def _stream(self) -> str:
        end = len(self.text) if self.finish_reason is not None else max(self._streamed, len(self.text) - self._holdback)
        delta = self.text[self._streamed : end]
        self._streamed = end
        return delta


def cut_at_stop(text: str, stops: Sequence[str], start: int = 0, keep: bool = False) -> tuple[str, bool]:
    """`text` cut at the first stop string found from `start` on (`keep`: after it, else before it), and
    whether one was found."""
    found = [(i, s) for i, s in ((text.find(s, start), s) for s in stops) if i >= 0]
    if not found:
        return text, False
    index, stop = min(found)
    return text[: index + len(stop) if keep else index], True


class OutputValidator:
    """Checks output text against the manifest's output_schema (JSON Schema draft 2020-12) and byte limit."""

    def __init__(self, schema: dict[str, Any] | None, max_bytes: int | None = None) -> None:
        self._validator = jsonschema.Draft202012Validator(schema) if schema is not None else None
        self.max_bytes = max_bytes

    def problem(self, text: str) -> str | None:
        """None when `text` is within the byte limit and JSON satisfying the schema, else what is wrong, in one line."""
        size = len(text.encode("utf-8"))
        if self.max_bytes is not None and size > self.max_bytes:
            return f"the answer is {size} bytes, over postprocess.max_output_bytes {self.max_bytes}"
        if self._validator is None:
            return None
        return schema_problem(self._validator, text)


def schema_problem(validator: Any, text: str) -> str | None:
    """None when `text` is JSON that satisfies the schema of `validator` (a jsonschema validator), else what is
    wrong, in one line."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at character {exc.pos})"
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{error.message} at /{where}" if where else error.message


def constraint_problem(constraint: OutputConstraint | None, text: str) -> str | None:
    """Why an output its constraint ended does not satisfy it, checked after the fact by other code than the
    mask (a remote's answer, or a grammar engine's slip). None: it does, or it cannot be checked afterwards
    (a grammar, or a regex Python's `re` does not read)."""
    if constraint is None:
        return None
    schema = constraint.schema()
    if schema is not None:
        problem = schema_problem(jsonschema.Draft202012Validator(schema), text)
        return None if problem is None else f"{constraint.param}: {problem}"
    if constraint.kind == "choice":
        choices = json.loads(constraint.spec)
        return None if text in choices else f"{constraint.param}: the output is not one of its {len(choices)} choices"
    if constraint.kind == "regex":
        try:
            pattern = re.compile(constraint.spec)
        except re.error:
            return None
        return None if pattern.fullmatch(text) else f"{constraint.param}: the output does not match the regex"
    return None


def output_problem(
    validator: OutputValidator | None,
    constraint: OutputConstraint | None,
    text: str,
    finish_reason: str,
    tools: ToolUse | None = None,
) -> tuple[bool | None, str | None]:
    """(valid, problem) of a final answer: the manifest's output_schema and byte limit; for an output its
    constraint ended (EOS), the request's constraint; for an output that ended by itself under tool_choice auto,
    its tool calls. valid is None when nothing was checked (an output cut short is not its constraint's to
    judge)."""
    problem = validator.problem(text) if validator is not None else None
    ended = constraint is not None and finish_reason == "eos"
    if problem is None and ended:
        problem = constraint_problem(constraint, text)
    calls = tools is not None and finish_reason != "length"
    if problem is None and tools is not None and calls:
        problem = read_tool_calls(tools, text).problem
    return (problem is None if validator is not None or ended or calls else None), problem
