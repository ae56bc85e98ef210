"""`gate run`: a JSONL file of requests in, a JSONL file of results out, resumable after any crash.

Input lines: {"id": ..., "prompt": "..."} or {"id": ..., "messages": [...]}, plus any request parameter
of the completions / chat API (max_tokens, temperature, top_p, top_k, seed, stop, logprobs, user),
validated by the same contract as the server, with the same defaults. Output lines, in input order:
{"id", "text", "finish_reason", "usage"} or {"id", "error": {"message", "type", "code", "param"}}; with
logprobs asked for, "logprobs" in the shape the line's API answers it (completions: tokens, token_logprobs,
top_logprobs, text_offset; chat: content).

Resumable: each result is appended, flushed and fsynced before the next, so after a kill every line
in the output is whole except perhaps a torn last one, which a rerun cuts off. A rerun skips the ids
already written; ids are checked (unique in the input, and every output id must come from the input),
so no line is lost or written twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegate.contracts import logprob_bodies
from servegate.contracts.errors import ServegateError, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.requests import parse_request
from servegate.runtime.engine.interface import Engine, vocab_size
from servegate.runtime.request_translator import engine_requests
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest

RecordId = str | int


@dataclass
class InputLine:
    """One request of the input file."""

    line: int
    id: RecordId
    data: dict[str, Any]


@dataclass
class RunSummary:
    """What a `gate run` did."""

    input_lines: int
    skipped: int
    """Ids already in the output from an earlier run."""
    completed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    """Error code -> count."""
    output_tokens: int = 0
    elapsed_s: float = 0.0

    @property
    def output_tokens_per_s(self) -> float:
        """Output tokens per second of this run."""
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON, with units in the key names."""
        return {
            "input_lines": self.input_lines,
            "skipped_already_done": self.skipped,
            "completed": self.completed,
            "errors": dict(self.errors),
            "output_tokens": self.output_tokens,
            "elapsed_s": round(self.elapsed_s, 3),
            "output_tokens_per_s": round(self.output_tokens_per_s, 2),
        }


def read_input(path: Path) -> list[InputLine]:
    """Parse the input file; a line without JSON or an id, or a repeated id, is a usage error (exit 2)."""
    if not path.is_file():
        raise ServegateError(f"{path}: input file not found")
    items: list[InputLine] = []
    seen: dict[RecordId, int] = {}
    with path.open(encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ServegateError(f"{path}:{number}: not JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(data, dict) or not isinstance(data.get("id"), (str, int)) or isinstance(data["id"], bool):
                raise ServegateError(f'{path}:{number}: each line is an object with an "id" (a string or an integer)')
            rid = data.pop("id")
            if rid in seen:
                raise ServegateError(f"{path}:{number}: id {rid!r} repeats line {seen[rid]}; ids must be unique")
            seen[rid] = number
            items.append(InputLine(number, rid, data))
    return items


def recover_output(path: Path, input_ids: set[RecordId]) -> set[RecordId]:
    """Ids already written; cuts a torn last line off. Refuses an output that belongs to another input."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    whole = data.rfind(b"\n") + 1
    if whole < len(data):  # a write interrupted by a crash: the record is redone
        with path.open("r+b") as handle:
            handle.truncate(whole)
            handle.flush()
            os.fsync(handle.fileno())
    done: set[RecordId] = set()
    for number, raw in enumerate(data[:whole].decode("utf-8").splitlines(), start=1):
        try:
            rid = json.loads(raw)["id"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ServegateError(f"{path}:{number}: not a result line; pass a new --output path") from None
        if rid not in input_ids:
            raise ServegateError(f"{path}:{number}: id {rid!r} is not in the input: is --output the right file?")
        if rid in done:
            raise ServegateError(f"{path}:{number}: id {rid!r} is written twice; the file was edited by hand")
        done.add(rid)
    return done


def to_generation_request(served: ServedModel, item: InputLine, vocab: int | None = None) -> GenerationRequest:
    """The engine request of an input line, validated as the API validates it (ServingError if bad); `vocab`:
    the engine's vocabulary size, which its token ids are checked against as `gate serve` checks them."""
    chat = "messages" in item.data
    body = parse_request(served, "chat" if chat else "completions", {"model": served.name, **item.data}, vocab)
    if body.n > 1 or body.prompt_count() > 1:
        param = "n" if body.n > 1 else "prompt"
        detail = f"{param}: an input line is one request with one answer; write one line per prompt and choice"
        raise ServingError("invalid_request", param=param, detail=detail)
    if body.prompt_logprobs is not None:
        detail = "prompt_logprobs: a result line holds the answer only; score prompts over HTTP (gate serve)"
        raise ServingError("unsupported_parameter", param="prompt_logprobs", detail=detail)
    tenant = body.user if served.preprocess.tenant_from == "user" else None
    (request,) = engine_requests(served, body, str(item.id), tenant)  # the deadline starts when it is submitted
    return request


def token_names(engine: Engine, event: FinishEvent) -> list[str]:
    """Each generated token's own text: as the engine named it (a remote), else as its tokenizer writes it."""
    if event.tokens is not None:
        return list(event.tokens)
    tokenizer = engine.tokenizer
    if tokenizer is None:
        return []  # logprob_bodies names each entry "" rather than dropping it
    return [tokenizer.decode([int(token)]) for token in event.token_ids]


def result_record(
    rid: RecordId, event: FinishEvent | ErrorEvent, chat: bool = False, names: list[str] | None = None
) -> dict[str, Any]:
    """The output line of one result; logprobs in the API's shape (`chat`: the chat API's), tokens as `names`."""
    if isinstance(event, ErrorEvent):
        return {"id": rid, "error": event.error.to_body()["error"]}
    usage = event.usage
    record: dict[str, Any] = {
        "id": rid,
        "text": event.text,
        "finish_reason": event.finish_reason,
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
            "truncated_tokens": usage.truncated_tokens,
        },
    }
    if event.logprobs is not None:
        tops = list(event.top_logprobs) if event.top_logprobs is not None else None
        if chat:
            record["logprobs"] = logprob_bodies.chat_logprobs(names or [], event.logprobs, tops)
        else:
            record["logprobs"] = logprob_bodies.completion_logprobs(names or [], event.logprobs, tops)
    for flag in ("fallback_used", "cached"):
        if getattr(event, flag):
            record[flag] = True
    if event.output_valid is not None:
        record["output_valid"] = event.output_valid
    return record


async def _result_of(engine: Any, served: ServedModel, item: InputLine) -> dict[str, Any]:
    try:
        request = to_generation_request(served, item, vocab_size(engine))
    except ServingError as error:
        return result_record(item.id, ErrorEvent(str(item.id), error))
    final: FinishEvent | ErrorEvent | None = None
    async for event in engine.submit(request):
        if isinstance(event, (FinishEvent, ErrorEvent)):
            final = event
    if final is None:  # an engine must end every request; say so rather than drop the line
        final = ErrorEvent(str(item.id), ServingError("internal", incident="no-result"))
    names = token_names(engine, final) if isinstance(final, FinishEvent) and final.logprobs is not None else None
    return result_record(item.id, final, chat=request.messages is not None, names=names)


class _Appender:
    """Appends one JSON line at a time, each flushed and fsynced before the next is written."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = path.open("ab")

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()


async def run_file(
    served: ServedModel,
    input_path: Path,
    output_path: Path,
    *,
    engine: Any = None,
    window: int | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> RunSummary:
    """Run every input line not yet in the output through the engine; results appended in input order.

    `engine`: a started engine (built from `served` and shut down here when None). `window`: requests
    in flight (default: enough to keep batches full, never more than the queue holds).
    """
    from servegate.runtime.failure_policy.outcomes import feed_window

    items = read_input(input_path)
    done = recover_output(output_path, {item.id for item in items})
    todo = [item for item in items if item.id not in done]
    summary = RunSummary(input_lines=len(items), skipped=len(done))
    owned = engine is None
    if owned:
        from servegate.runtime import build

        engine = build(served)
        await engine.start()
    appender = _Appender(output_path)
    started = time.monotonic()
    try:
        in_flight: deque[asyncio.Task[dict[str, Any]]] = deque()
        limit = window or feed_window(served)

        def write(record: dict[str, Any]) -> None:
            appender.write(record)
            if "error" in record:
                summary.errors[record["error"]["code"]] += 1
            else:
                summary.completed += 1
                summary.output_tokens += record["usage"]["completion_tokens"]
            if on_record is not None:
                on_record(record)

        for item in todo:
            if len(in_flight) >= limit:
                write(await in_flight.popleft())
            in_flight.append(asyncio.create_task(_result_of(engine, served, item)))
        while in_flight:
            write(await in_flight.popleft())
    finally:
        summary.elapsed_s = time.monotonic() - started
        appender.close()
        if owned:
            await engine.shutdown()
    return summary
