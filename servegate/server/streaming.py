"""Server-sent events in the OpenAI chunk format: `data: {chunk}` lines, ending in `data: [DONE]`.

Each choice (prompt x n) is its own engine request; their chunks interleave, each naming its choice index.
The response starts only once every choice's first event is in, so a request refused before generating (overload,
input too long, queue deadline) still gets its proper HTTP status. An error after that arrives as one
`data: {"error": ...}` event (OpenAI clients raise it), then `[DONE]`. The streamed text always adds up
to the FinishEvent's text, so a stream and a non-streamed request with the same seed say the same thing; with
vLLM's `return_token_ids`, each chunk carries the ids of the tokens it delivers and a token without a chunk of
its own (EOS, text held back) rides with the last, so the ids too add up to the FinishEvent's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse

from servegate.contracts import logprob_bodies
from servegate.contracts.errors import ServingError
from servegate.contracts.responses import ChatDelta
from servegate.runtime.tool_calls import streamable_content
from servegate.runtime.types import FinishEvent, TokenEvent, Usage
from servegate.server.bodies import BodyBuilder, finish_reason
from servegate.server.generation import EngineRun, cache_state, event_token_strings, first_failure
from servegate.server.state import ServerState

log = logging.getLogger("servegate.server")


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


Event = TokenEvent | FinishEvent | ServingError


async def _pump(index: int, run: EngineRun, queue: asyncio.Queue[tuple[int, Event]]) -> None:
    """Forward one choice's events after its first, tagged with its index, ending at its finish or error."""
    try:
        while True:
            event = await run.next()
            queue.put_nowait((index, event))
            if isinstance(event, FinishEvent):
                return
    except ServingError as error:
        queue.put_nowait((index, error))


def _finish_chunks(
    run: EngineRun, event: FinishEvent, streamed: str, builder: BodyBuilder, chat: bool, index: int, ids: list[int]
) -> list[dict[str, Any]]:
    """The last chunks of a choice: the text held back so far, its tool calls (each whole), and the reason; the
    first of them carries `ids`, the tokens no earlier chunk delivered."""
    reading = builder.reading(event) if chat else None
    content = event.text if reading is None else reading.content or ""
    # The engine may hold back text that could start a stop string (or a tool call): send what is left.
    rest = content[len(streamed) :] if content.startswith(streamed) else ""
    if not content.startswith(streamed):
        log.warning("request %s: streamed text and final text differ", run.request.id)
    reason = finish_reason(event, reading, builder.tools)
    if not chat:
        return [builder.completion_chunk(rest, reason, index, token_ids=ids)]
    if reading is None or not reading.calls:
        return [builder.chat_chunk(ChatDelta(content=rest or None), reason, index, token_ids=ids)]
    chunks = [builder.chat_chunk(ChatDelta(content=rest), index=index, token_ids=ids)] if rest else []
    calls = ChatDelta(tool_calls=builder.tool_call_deltas(reading, index))
    return [*chunks, builder.chat_chunk(calls, reason, index, token_ids=() if rest else ids)]


def _unsent_ids(run: EngineRun, event: FinishEvent, sent: list[int], pending: list[int]) -> list[int]:
    """The ids of a choice's tokens no chunk delivered yet. The final ids decide (usage.completion_tokens counts
    them): those past the ones sent, so the chunks' ids add up to them. An end-of-sequence token, or a token whose
    text is held back (a stop string, a tool call), has no chunk of its own and arrives here."""
    final = [int(t) for t in event.token_ids]
    if final[: len(sent)] == sent:
        return final[len(sent) :]
    log.warning("request %s: streamed token ids and final token ids differ", run.request.id)
    return pending


def _chunk_logprobs(
    state: ServerState, event: TokenEvent, chat: bool, offset: int
) -> tuple[dict[str, Any] | None, int]:
    """The logprobs object of one streamed event (None when not asked for), and the text offset after it."""
    if event.logprobs is None:
        return None, offset
    names = event_token_strings(state, event)
    tops = list(event.top_logprobs) if event.top_logprobs is not None else None
    if chat:
        body = logprob_bodies.chat_logprobs(names, event.logprobs, tops)
    else:
        body = logprob_bodies.completion_logprobs(names, event.logprobs, tops, offset)
    return body, offset + sum(len(n) for n in names[: len(event.logprobs)])


async def _chunks(
    state: ServerState,
    runs: list[EngineRun],
    firsts: list[TokenEvent | FinishEvent],
    builder: BodyBuilder,
    endpoint: str,
    chat: bool,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
    for index, first in enumerate(firsts):
        queue.put_nowait((index, first))
    pumps = [
        asyncio.ensure_future(_pump(i, run, queue)) for i, run in enumerate(runs) if isinstance(firsts[i], TokenEvent)
    ]
    streamed = [""] * len(runs)
    raw = [""] * len(runs)
    offsets = [0] * len(runs)
    sent: list[list[int]] = [[] for _ in runs]  # ids the choice's chunks delivered (return_token_ids)
    pending: list[list[int]] = [[] for _ in runs]  # ids generated since its last chunk
    usages: list[Usage] = []
    finished = 0
    try:
        if chat:
            for index in range(len(runs)):
                yield sse(builder.chat_chunk(ChatDelta(role="assistant", content=""), index=index))
        while finished < len(runs):
            index, event = await queue.get()
            if isinstance(event, ServingError):
                yield sse(event.to_body())
                break
            if isinstance(event, TokenEvent):
                logprobs, offsets[index] = _chunk_logprobs(state, event, chat, offsets[index])
                pending[index].extend(int(t) for t in event.token_ids)
                raw[index] += event.text
                # Under tools, text that is (or may begin) a call is held back for the last chunks.
                content = streamable_content(builder.tools, raw[index]) if chat else raw[index]
                text = content[len(streamed[index]) :]
                if text or logprobs is not None:  # a token without text (EOS) still has its logprob
                    streamed[index] = content
                    ids, pending[index] = pending[index], []
                    sent[index].extend(ids)
                    if chat:
                        delta = ChatDelta(content=text)
                        yield sse(builder.chat_chunk(delta, index=index, logprobs=logprobs, token_ids=ids))
                    else:
                        yield sse(builder.completion_chunk(text, index=index, logprobs=logprobs, token_ids=ids))
                continue
            rest = _unsent_ids(runs[index], event, sent[index], pending[index]) if builder.token_ids else []
            for chunk in _finish_chunks(runs[index], event, streamed[index], builder, chat, index, rest):
                yield sse(chunk)
            runs[index].record(endpoint, event)
            usages.append(event.usage)
            finished += 1
        else:
            if include_usage:
                yield sse(builder.usage_chunk(chat, usages))
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for run in runs:
            await run.close()
    yield sse("[DONE]")


async def _first_events(runs: list[EngineRun]) -> list[TokenEvent | FinishEvent]:
    """Every choice's first event; the first refusal (by index) closes them all and is raised."""
    tasks = [asyncio.ensure_future(run.next()) for run in runs]
    error = await first_failure(tasks)
    if error is not None or any(task.cancelled() for task in tasks):
        for run in runs:
            await run.close()
        if error is not None:
            raise error
        raise asyncio.CancelledError
    return [task.result() for task in tasks]


async def stream_response(
    state: ServerState, runs: list[EngineRun], builder: BodyBuilder, endpoint: str, chat: bool, include_usage: bool
) -> StreamingResponse:
    """Wait for every choice's first event (errors before them raise ServingError), then stream all as SSE."""
    firsts = await _first_events(runs)
    builder.cache = cache_state(state, [event.cached for event in firsts])
    headers = {"Cache-Control": "no-cache", "X-Request-Id": builder.id, "X-Accel-Buffering": "no"}
    if builder.cache is not None:
        headers["X-Servegate-Cache"] = builder.cache
    body = _chunks(state, runs, firsts, builder, endpoint, chat, include_usage)
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)
