"""The ASGI body guard: every API request passes it before any route parses a byte.

It refuses non-JSON content types (415) and bodies over preprocess.max_payload_bytes (413: from
Content-Length without reading, or as soon as the streamed body passes the limit), answers 503 while
the server loads or drains, counts requests in flight for the graceful shutdown, and counts and logs every
response by endpoint label and status (uvicorn's own access log is off: it prints raw paths and queries).
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servegate.contracts.errors import ServingError
from servegate.server.state import ServerState, error_response

access = logging.getLogger("servegate.access")
_GUARDED = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/tokenize", "/detokenize"})
"""Paths whose POST bodies the guard checks (every other POST is answered by the router: 404, or 405 with Allow)."""
_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"})

ENDPOINT_LABELS = {
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat",
    "/v1/embeddings": "embeddings",
    "/v1/models": "models",
    "/health": "health",
    "/ready": "ready",
    "/metrics": "metrics",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
    "/tokenizer_info": "tokenizer_info",
    "/openapi.json": "openapi",
}
"""Metric label per path; paths outside this closed set are labelled `requests` (polling) or `other`."""


def endpoint_label(path: str) -> str:
    """The metric label of a request path (never the path itself: it could carry anything)."""
    if path in ENDPOINT_LABELS:
        return ENDPOINT_LABELS[path]
    return "requests" if path.startswith("/v1/requests/") else "other"


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _content_type_error(content_type: str | None) -> ServingError | None:
    """None when the content type is JSON in UTF-8; else unsupported_media (415)."""
    if content_type is None:
        return ServingError("unsupported_media", content_type="none")
    media, _, params = content_type.partition(";")
    charset = next(
        (
            p.split("=", 1)[1].strip().strip('"').lower()
            for p in params.split(";")
            if p.strip().lower().startswith("charset=")
        ),
        "utf-8",
    )
    if media.strip().lower() != "application/json" or charset not in ("utf-8", "utf8"):
        shown = content_type if len(content_type) <= 80 else content_type[:80] + "..."
        return ServingError("unsupported_media", content_type=shown)
    return None


class BodyGuard:
    """ASGI middleware in front of the routes; see the module docstring."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        label = endpoint_label(scope["path"])
        metrics = self.state.metrics
        started = time.monotonic()
        method = scope["method"] if scope["method"] in _METHODS else "OTHER"

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                metrics.request_done(label, message["status"])
                # The access line names the endpoint label, never the raw path or query: both are client text.
                elapsed_ms = (time.monotonic() - started) * 1000
                access.info("%s %s -> %d (%.1f ms to first byte)", method, label, message["status"], elapsed_ms)
            await send(message)

        if scope["method"] != "POST" or scope["path"] not in _GUARDED:
            await self.app(scope, receive, counted_send)
            return
        refusal, body = await self._admit(scope, receive)
        if refusal is not None:
            await error_response(refusal)(scope, receive, counted_send)
            return
        self.state.in_flight += 1
        metrics.in_flight.inc()
        try:
            await self.app(scope, _replay(body, receive), counted_send)
        finally:
            self.state.in_flight -= 1
            metrics.in_flight.dec()

    async def _admit(self, scope: Scope, receive: Receive) -> tuple[ServingError | None, bytes]:
        """Check readiness (loading, draining), content type and size; read the body only when it can still be
        accepted. The routes behind the guard check none of these again."""
        served = self.state.served
        unavailable = self.state.unavailable()
        if unavailable is not None:
            return unavailable, b""
        refusal = _content_type_error(_header(scope, b"content-type"))
        if refusal is not None:
            return refusal, b""
        limit = served.preprocess.max_payload_bytes
        declared = _header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            return ServingError("payload_too_large", size=int(declared), limit=limit), b""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return ServingError("payload_too_large", size=f"more than {limit}", limit=limit), b""
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return None, b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that hands the already-read body once, then defers to the connection (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
