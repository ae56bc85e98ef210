"""A fake OpenAI-compatible endpoint with faults that show only under load, for the load and contract gates.

`FaultyRemote` is `FakeRemote` (same identity, models and metrics routes) with its own
`/v1/completions`: it answers streamed or not as asked, ends on `length` or `stop` as a real engine does,
reports usage, and holds every answer `hold_s` so that concurrent requests overlap. `RemoteFaults` plants
what the gates must catch: answers that change when requests share a batch, a first streamed token that
is not the final text's, usage that miscounts, JSON that breaks above a concurrency.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from support.fake_remote import FakeRemote


@dataclass(frozen=True)
class RemoteFaults:
    """Faults of the endpoint; all off is the safe twin."""

    shared_batch_bug: bool = False
    """An answer computed while another request is in flight gets its first character changed."""
    first_token_bug: bool = False
    """The first streamed chunk carries a wrong character; the rest of the stream and the plain answer are right."""
    usage_extra: int = 0
    """usage.completion_tokens reports this many tokens more than were sent."""
    json_breaks_above: int = 0
    """With more than this many requests in flight, answers ending in `}` lose it (0: never)."""


def _changed(text: str) -> str:
    return ("#" if text[:1] != "#" else "$") + text[1:]


@dataclass
class FaultyRemote(FakeRemote):
    """`with FaultyRemote(behaviour, faults=RemoteFaults(...)) as remote: remote.url`."""

    faults: RemoteFaults = field(default_factory=RemoteFaults)
    hold_s: float = 0.01
    """Seconds every answer takes before its first byte, so requests sent together are in flight together."""
    busy_max: int = 0
    """Most requests that were in flight at once."""
    _busy: int = 0
    _held: list[list[int]] = field(default_factory=list)
    """Per request being held, the most requests in flight at any moment of its hold."""

    def app(self) -> FastAPI:
        """FakeRemote's app with /v1/completions replaced by the faulty one."""
        app = super().app()
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") != "/v1/completions"]

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            self.bodies.append(body)
            text, busy = await self._held_answer(body)
            return self._reply(body, text, busy)

        return app

    async def _held_answer(self, body: dict[str, Any]) -> tuple[str, int]:
        ids = body["prompt"] if isinstance(body["prompt"], list) else [1]
        max_tokens = int(body.get("max_tokens", 16))
        # A request's load is the peak in flight during its hold, not the count at the moment it wakes: on a busy
        # runner, requests sent together arrive spread over more than hold_s, and the fault must still fire.
        self._busy += 1
        peak = [self._busy]
        self._held.append(peak)
        for cell in self._held:
            cell[0] = max(cell[0], self._busy)
        try:
            await asyncio.sleep(self.hold_s)
            busy = peak[0]
            self.busy_max = max(self.busy_max, busy)
        finally:
            self._held = [cell for cell in self._held if cell is not peak]
            self._busy -= 1
        text = (await asyncio.to_thread(self._answer, ids, max_tokens))[:max_tokens]
        f = self.faults
        if f.shared_batch_bug and busy > 1:
            text = _changed(text)
        if f.json_breaks_above and busy > f.json_breaks_above and text.endswith("}"):
            text = text[:-1]
        return text, busy

    def _reply(self, body: dict[str, Any], text: str, busy: int) -> Any:
        max_tokens = int(body.get("max_tokens", 16))
        reason = "length" if len(text) >= max_tokens else "stop"
        prompt_tokens = len(body["prompt"]) if isinstance(body["prompt"], list) else 1
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(text) + self.faults.usage_extra}
        if not body.get("stream"):
            choice = {"index": 0, "text": text, "finish_reason": reason, "stop_reason": None}
            return {"id": "cmpl-fault", "object": "text_completion", "model": self.behaviour.model,
                    "choices": [choice], "usage": usage}  # fmt: skip
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(self._chunks(text, reason, usage if with_usage else None),
                                 media_type="text/event-stream")  # fmt: skip

    async def _chunks(self, text: str, reason: str, usage: dict[str, int] | None) -> AsyncIterator[str]:
        for i, char in enumerate(text):
            sent = _changed(char) if i == 0 and self.faults.first_token_bug else char
            yield f"data: {json.dumps({'choices': [{'index': 0, 'text': sent, 'finish_reason': None}]})}\n\n"
        end = {"index": 0, "text": "", "finish_reason": reason, "stop_reason": None}
        yield f"data: {json.dumps({'choices': [end]})}\n\n"
        if usage is not None:
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"
