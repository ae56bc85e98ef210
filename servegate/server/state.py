"""What one running server knows about itself: the manifest, the engine, readiness, draining and load."""

from __future__ import annotations

import logging
import secrets
import time
import traceback
from dataclasses import dataclass, field

from starlette.responses import JSONResponse

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.interface import Engine
from servegate.runtime.types import EngineStats
from servegate.server.async_results import AsyncResults
from servegate.server.prometheus_metrics import ServerMetrics

log = logging.getLogger("servegate.server")


@dataclass
class ServerState:
    """Readiness and load of one server; shared by the routes, the body guard and the runner."""

    served: ServedModel
    engine: Engine
    metrics: ServerMetrics
    async_results: AsyncResults
    started_at: float = field(default_factory=time.time)
    ready: bool = False
    """Model loaded and warm-up passed."""
    not_ready_reason: str = "starting: loading the model"
    starting: bool = True
    """Still loading the model or warming up; False once that ended, ready or not (then not_ready_reason
    says why it will not become ready by itself)."""
    draining: bool = False
    """SIGTERM received: new requests get 503 while in-flight ones finish."""
    in_flight: int = 0
    """HTTP requests to /v1/* being served (a stream counts until its last byte)."""

    def busy(self) -> int:
        """Work that must finish before a graceful exit: in-flight requests plus pending async requests."""
        return self.in_flight + self.async_results.pending()

    def new_request_id(self, prefix: str) -> str:
        """A unique, unguessable request id (also the async polling key)."""
        return f"{prefix}-{secrets.token_hex(12)}"

    def unavailable(self) -> ServingError | None:
        """The model_unavailable (503) every request gets while loading, after a failed warm-up or while draining;
        None when the server takes requests. The body guard asks it once per API request, /ready and
        /tokenizer_info for theirs."""
        if not self.draining and self.ready:
            return None
        reason = "shutting down" if self.draining else self.not_ready_reason
        return ServingError("model_unavailable", retry_after_s=self.served.failure_policy.retry_after_s, detail=reason)

    def stats(self) -> EngineStats | None:
        """The engine's counters, or None when the engine cannot report them (never fails a scrape)."""
        try:
            return self.engine.stats()
        except Exception:  # a scrape must not fail because the engine is still starting
            return None


def normalize(error: ServingError, served: ServedModel) -> ServingError:
    """Give `overloaded` the manifest's declared status and Retry-After, whatever the engine set."""
    if error.code == "overloaded":
        fail = served.failure_policy
        error.status = fail.overload_status
        if error.retry_after_s is None:
            error.retry_after_s = fail.retry_after_s
    return error


def error_response(error: ServingError, request_id: str | None = None) -> JSONResponse:
    """The OpenAI-shaped JSON response of a catalogued error, with Retry-After where it applies."""
    headers = error.headers()
    if request_id:
        headers["X-Request-Id"] = request_id
    return JSONResponse(error.to_body(), status_code=error.status, headers=headers)


def internal_error(exc: BaseException) -> ServingError:
    """A 500 for a server fault; the log names the incident and the exception type, never request data."""
    incident = secrets.token_hex(6)
    log.error("internal error %s: %s (traceback at debug level)", incident, type(exc).__name__)
    # The traceback can quote a prompt (e.g. in a KeyError), so it is only shown at debug level.
    log.debug("internal error %s:\n%s", incident, "".join(traceback.format_exception(exc)))
    return ServingError("internal", incident=incident)
