"""Server-sent events in the OpenAI chunk format: `data: {chunk}` lines, ending in `data: [DONE]`.

The response starts only once the first event is in, so a request refused before generating (overload,
input too long, queue deadline) still gets its proper HTTP status. An error after that arrives as one
`data: {"error": ...}` event (OpenAI clients raise it), then `[DONE]`. The streamed text always adds up
to the FinishEvent's text, so a stream and a non-streamed request with the same seed say the same thing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse

from servegate.contracts.errors import ServingError
from servegate.contracts.responses import ChatDelta
from servegate.runtime.api import FinishEvent, TokenEvent
from servegate.server.bodies import BodyBuilder, finish_reason
from servegate.server.generation import EngineRun

log = logging.getLogger("servegate.server")


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


async def _chunks(
    run: EngineRun,
    first: TokenEvent | FinishEvent,
    builder: BodyBuilder,
    endpoint: str,
    chat: bool,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    streamed = ""
    event: TokenEvent | FinishEvent = first
    try:
        if chat:
            yield sse(builder.chat_chunk(ChatDelta(role="assistant", content="")))
        while True:
            if isinstance(event, TokenEvent):
                if event.text:
                    streamed += event.text
                    delta = ChatDelta(content=event.text)
                    yield sse(builder.chat_chunk(delta) if chat else builder.completion_chunk(event.text))
            else:
                # The engine may hold back text that could start a stop string: send what is left.
                rest = event.text[len(streamed) :] if event.text.startswith(streamed) else ""
                if not event.text.startswith(streamed):
                    log.warning("request %s: streamed text and final text differ", run.request.id)
                reason = finish_reason(event)
                chunk = builder.chat_chunk(ChatDelta(content=rest or None), reason) if chat else None
                yield sse(chunk if chat else builder.completion_chunk(rest, reason))
                if include_usage:
                    yield sse(builder.usage_chunk(chat, event.usage))
                run.record(endpoint, event)
                break
            event = await run.next()
    except ServingError as error:
        yield sse(error.to_body())
    finally:
        await run.close()
    yield sse("[DONE]")


async def stream_response(
    run: EngineRun, builder: BodyBuilder, endpoint: str, chat: bool, include_usage: bool
) -> StreamingResponse:
    """Wait for the first event (errors before it raise ServingError), then stream the rest as SSE."""
    try:
        first = await run.next()
    except ServingError:
        await run.close()
        raise
    headers = {"Cache-Control": "no-cache", "X-Request-Id": run.request.id, "X-Accel-Buffering": "no"}
    body = _chunks(run, first, builder, endpoint, chat, include_usage)
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)
