"""An OpenAI-compatible completions server with declared delays: what the bench is calibrated against.

It streams `max_tokens` chunks: the first `ttft_ms` after the request is read, then one every `itl_ms`,
on absolute deadlines so delays do not drift. With zero delays it is the null server that the bench's
own overhead is measured against. `slots` bounds how many requests it serves at once (the rest queue),
which makes queueing visible to open-loop tests. Raw asyncio streams keep its own overhead minimal.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Delays:
    """The server's behaviour per request."""

    ttft_ms: float = 0.0
    """From the request being read to the first chunk."""
    itl_ms: float = 0.0
    """Between consecutive chunks."""
    slots: int = 0
    """Requests served at once (0: unbounded)."""


@dataclass(frozen=True)
class Faults:
    """What the server does wrong, so the bench's own checks can be tested (all off by default)."""

    max_prompt_chars: int | None = None
    """Answer 400 `context_length_exceeded` to a longer prompt (the probe's 5 characters pass)."""
    keep_prompt_tokens: int | None = None
    """Truncate prompts to this many tokens (one per character) and report the kept count."""
    stop_after: int | None = None
    """Stream at most this many tokens, whatever max_tokens asks."""
    usage_extra_tokens: int = 0
    """Added to the completion tokens `usage` reports (a server that miscounts)."""


class SyntheticServer:
    """Run with `with SyntheticServer(Delays(...)) as server: ... server.url`; serves in a background thread."""

    def __init__(
        self, delays: Delays | None = None, host: str = "127.0.0.1", port: int = 0, faults: Faults | None = None
    ) -> None:
        self.delays = delays or Delays()
        self.faults = faults or Faults()
        self.host, self.port = host, port
        self.requests_seen = 0
        self.last_headers: dict[str, str] = {}
        """Headers of the latest request (lower-case names)."""
        self.prompts: list[str] = []
        """Every prompt received, in order."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """Base URL of the OpenAI API (…/v1)."""
        return f"http://{self.host}:{self.port}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                received = time.perf_counter()
                self.requests_seen += 1
                self.last_headers = headers
                await self._respond(json.loads(body or b"{}"), received, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._handlers.discard(task)

    async def _respond(self, request: dict, received: float, writer: asyncio.StreamWriter) -> None:
        assert self._slots is not None
        prompt = str(request.get("prompt", ""))
        self.prompts.append(prompt)
        f = self.faults
        if f.max_prompt_chars is not None and len(prompt) > f.max_prompt_chars:
            message = f"prompt of {len(prompt)} tokens is over {f.max_prompt_chars}"
            payload = json.dumps({"error": {"message": message, "code": "context_length_exceeded"}}).encode()
            writer.write(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: keep-alive\r\n\r\n%s" % (len(payload), payload)
            )
            await writer.drain()
            return
        async with self._slots:
            n = int(request.get("max_tokens", 16))
            if f.stop_after is not None:
                n = min(n, f.stop_after)
            start = time.perf_counter() if self.delays.slots else received
            rid = f"cmpl-synthetic-{self.requests_seen}"  # every chunk carries its response's id, as OpenAI's do
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                b"connection: keep-alive\r\n\r\n"
            )
            for i in range(n):
                due = start + (self.delays.ttft_ms + i * self.delays.itl_ms) / 1000
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                self._chunk(writer, {"id": rid, "choices": [{"index": 0, "text": "x", "finish_reason": None}]})
                await writer.drain()
            kept = len(prompt) if f.keep_prompt_tokens is None else min(len(prompt), f.keep_prompt_tokens)
            usage = {"prompt_tokens": kept, "completion_tokens": n + f.usage_extra_tokens}
            self._chunk(
                writer, {"id": rid, "choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}
            )
            payload = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload))
            await writer.drain()

    @staticmethod
    def _chunk(writer: asyncio.StreamWriter, event: dict) -> None:
        payload = b"data: " + json.dumps(event).encode() + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self._slots = asyncio.Semaphore(self.delays.slots or 1_000_000)
        server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            for task in list(self._handlers):  # connections still open (idle keep-alive ones too)
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

    def start(self) -> SyntheticServer:
        """Start serving in a daemon thread; returns when the port is bound."""
        self._slots: asyncio.Semaphore | None = None

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._main())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="synthetic-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the synthetic server did not start within 10 s")
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> SyntheticServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # `python tests/support/synthetic_server.py PORT [TTFT_MS ITL_MS]`: serve until killed
    import sys

    args = sys.argv[1:]
    server = SyntheticServer(
        Delays(float(args[1]) if len(args) > 1 else 0.0, float(args[2]) if len(args) > 2 else 0.0),
        port=int(args[0]),
    ).start()
    print(server.url, flush=True)
    threading.Event().wait()
