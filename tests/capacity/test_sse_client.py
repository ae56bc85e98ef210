"""The bench's HTTP client over pooled keep-alive connections that the server drops when idle (as uvicorn does
after 5 s): every request after a quiet spell must still be answered, not counted as failed."""

from __future__ import annotations

import asyncio
import json

import pytest

from servegate.capacity.bench import sse_client
from servegate.capacity.bench.sse_client import SSEClient

IDLE_CLOSE_S = 0.2


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, accepted: list[int]) -> None:
    """Answer POSTs with a two-event stream; close the connection once it has been idle IDLE_CLOSE_S."""
    accepted.append(1)
    try:
        while True:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_CLOSE_S)
            except (TimeoutError, asyncio.IncompleteReadError):
                return
            length = next(
                int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            body = b"data: " + json.dumps({"choices": [{"text": "x"}]}).encode() + b"\n\ndata: [DONE]\n\n"
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            await writer.drain()
    finally:
        writer.close()


async def _rounds(client: SSEClient, rounds: int, concurrent: int, pause_s: float) -> list[int]:
    """`rounds` bursts of `concurrent` requests, `pause_s` apart; the events each request got."""
    got: list[int] = []

    async def one() -> None:
        events: list[str] = []
        await client.post_events("/v1/completions", b"{}", lambda data, _: events.append(data) and False)
        got.append(len(events))

    for _ in range(rounds):
        await asyncio.gather(*(one() for _ in range(concurrent)))
        await asyncio.sleep(pause_s)
    return got


@pytest.mark.parametrize("reuse_s", [60.0, 0.1], ids=["server-drops-first", "client-retires-first"])
def test_requests_after_a_quiet_spell_are_answered_on_fresh_connections(
    monkeypatch: pytest.MonkeyPatch, reuse_s: float
) -> None:
    # server-drops-first: every pooled connection was closed by the server during the pause; the client must notice
    # (or retry on a new connection), never retry on a second dropped one. client-retires-first: the client stops
    # reusing connections before a server would drop them.
    monkeypatch.setattr(sse_client, "IDLE_REUSE_S", reuse_s)
    accepted: list[int] = []

    async def go() -> list[int]:
        server = await asyncio.start_server(lambda r, w: _serve(r, w, accepted), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = SSEClient(f"http://127.0.0.1:{port}")
        try:
            return await _rounds(client, rounds=3, concurrent=4, pause_s=2 * IDLE_CLOSE_S)
        finally:
            await client.aclose()
            server.close()

    got = asyncio.run(go())
    assert got == [2] * 12  # every request answered, its two events read
    assert len(accepted) >= 8  # the later bursts came on new connections
