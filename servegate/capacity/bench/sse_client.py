"""A lean HTTP/1.1 client for streamed (server-sent events) POST requests, used on the bench's hot path.

Why not httpx here: measured against a null server on this 2-core machine, httpx added 1.4-9 ms to
time-to-first-token (its per-request Python work competes for the CPU with the server under test),
while a plain asyncio stream added 0.3 ms; the bench must add < 1 ms. Everything else (the endpoint
engine, probes) uses httpx. Keep-alive connections are pooled; chunked and Content-Length bodies and
connection-close bodies are read; each SSE event is handed over with the time its bytes arrived.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

EventHandler = Callable[[str, float], bool | None]
"""Called with each event's data and its arrival time (perf_counter); returning True stops reading."""


class HttpStatusError(Exception):
    """A non-200 answer; carries the status and the start of the body."""

    def __init__(self, status: int, body: str) -> None:
        self.status, self.body = status, body
        super().__init__(f"HTTP {status}: {body[:300]}")


IDLE_REUSE_S = 4.0
"""A pooled connection idle longer than this is closed, not reused: servers drop idle keep-alive connections
(uvicorn, which vLLM's and servegate's servers run on, after 5 s), and a request written to one they dropped
gets no answer."""


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = time.monotonic()

    def reusable(self) -> bool:
        """Whether the connection is fresh enough to send on: not closed by the server, not idle too long."""
        return not self.reader.at_eof() and time.monotonic() - self.idle_since < IDLE_REUSE_S


class SSEClient:
    """POST a JSON body and read the response's server-sent events, over pooled keep-alive connections."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL (got {base_url!r})")
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: {parts.netloc}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n{extra}"
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        context = ssl.create_default_context() if self.tls else None
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=context, limit=2**20)
        return _Conn(reader, writer)

    async def post_events(self, path: str, body: bytes, on_event: EventHandler) -> None:
        """POST `body` to prefix + path and feed every SSE `data:` payload to `on_event` until the stream ends."""
        request = (
            f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        for attempt in (0, 1):
            # the retry always opens a new connection: after a quiet spell every pooled one may have been dropped
            conn = self._pooled() if attempt == 0 else None
            reused = conn is not None
            conn = conn or await self._connect()
            try:
                conn.writer.write(request)
                head = await conn.reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                conn.writer.close()
                if reused:  # the server closed an idle keep-alive connection before reading the request
                    continue
                raise
            keep = await self._read_response(conn, head, on_event)
            if keep:
                self._release(conn)
            else:
                conn.writer.close()
            return

    def _pooled(self) -> _Conn | None:
        """The most recently used idle connection still fit to send on (stale ones are closed), or None."""
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable():
                return conn
            conn.writer.close()
        return None

    def _release(self, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    async def _read_response(self, conn: _Conn, head: bytes, on_event: EventHandler) -> bool:
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip().lower() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        chunked = "chunked" in headers.get("transfer-encoding", "")
        length = int(headers["content-length"]) if "content-length" in headers else None
        keep = headers.get("connection") != "close" and (chunked or length is not None)
        reader = conn.reader
        if status != 200:
            body = await self._read_all(reader, chunked, length)
            if not keep:
                conn.writer.close()
            else:
                self._release(conn)
            raise HttpStatusError(status, body.decode("utf-8", "replace"))
        buffer = b""
        stopped = False
        while True:
            if chunked:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")  # end of the (empty) trailer section
                    break
                data = (await reader.readexactly(size + 2))[:-2]
            elif length is not None:
                if length == 0:
                    break
                data = await reader.read(length)
                length -= len(data)
            else:
                data = await reader.read(65536)
                if not data:
                    break
            now = time.perf_counter()
            if stopped:
                continue  # drain the rest so the connection can be reused
            buffer += data.replace(b"\r\n", b"\n")
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                payload = "\n".join(
                    ln[5:].lstrip() for ln in event.decode("utf-8", "replace").split("\n") if ln.startswith("data:")
                )
                if payload and on_event(payload, now):
                    stopped = True
                    break
        return keep

    @staticmethod
    async def _read_all(reader: asyncio.StreamReader, chunked: bool, length: int | None) -> bytes:
        if length is not None:
            return await reader.readexactly(length)
        if not chunked:
            return await reader.read(65536)
        out = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return out
            out += (await reader.readexactly(size + 2))[:-2]

    async def aclose(self) -> None:
        """Close every pooled connection."""
        while self._idle:
            self._idle.pop().writer.close()
