"""Every error servegate can return to a client, in one catalogue, and the exceptions that carry them.

Error bodies are OpenAI-shaped: {"error": {"message", "type", "code", "param"}}. The catalogue is the
single source for the server's status codes, the contract gate's probes and the serving note.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ErrorSpec:
    """One catalogued error: its code, HTTP status, OpenAI error type, whether a retry can help."""

    code: str
    """Machine-readable code sent as error.code."""
    status: int
    """HTTP status (overloaded uses failure_policy.overload_status instead)."""
    type: str
    """OpenAI error type sent as error.type."""
    retryable: bool
    """Whether the same request may succeed later."""
    template: str
    """Message template; placeholders are filled from the error's details."""
    client_error: bool
    """True when the client's request caused it (it must never become a 500)."""


CATALOGUE: dict[str, ErrorSpec] = {
    spec.code: spec
    for spec in (
        ErrorSpec("invalid_request", 400, "invalid_request_error", False, "{detail}", True),
        ErrorSpec("unknown_parameter", 400, "invalid_request_error", False, "unknown parameter '{param}'{hint}", True),
        ErrorSpec(
            "unsupported_parameter",
            400,
            "invalid_request_error",
            False,
            "parameter '{param}' is not supported: {detail}",
            True,
        ),
        ErrorSpec(
            "invalid_constraint",
            400,
            "invalid_request_error",
            False,
            "the output constraint in '{param}' cannot be enforced: {detail}",
            True,
        ),
        ErrorSpec(
            "input_too_long",
            400,
            "invalid_request_error",
            False,
            "the prompt has {tokens} tokens; this model accepts at most {limit}",
            True,
        ),
        ErrorSpec(
            "payload_too_large",
            413,
            "invalid_request_error",
            False,
            "the request body has {size} bytes; at most {limit} are accepted",
            True,
        ),
        ErrorSpec(
            "unsupported_media",
            415,
            "invalid_request_error",
            False,
            "content type must be application/json (got {content_type})",
            True,
        ),
        ErrorSpec(
            "invalid_output",
            502,
            "server_error",
            True,
            "the model's output does not satisfy the declared output schema: {detail}",
            False,
        ),
        ErrorSpec(
            "overloaded", 429, "rate_limit_error", True, "the server is overloaded; retry after {retry_after} s", False
        ),
        ErrorSpec(
            "deadline_exceeded",
            504,
            "timeout_error",
            True,
            "the request did not finish within its deadline of {timeout_s} s",
            False,
        ),
        ErrorSpec("model_unavailable", 503, "server_error", True, "the model is not ready: {detail}", False),
        ErrorSpec("not_found", 404, "invalid_request_error", False, "{detail}", True),
        ErrorSpec("internal", 500, "server_error", True, "internal error (id {incident})", False),
    )
}


class ServingError(Exception):
    """A catalogued error raised while serving a request; becomes an OpenAI-shaped error body."""

    def __init__(
        self,
        code: str,
        *,
        param: str | None = None,
        status: int | None = None,
        retry_after_s: int | None = None,
        **details: Any,
    ) -> None:
        if code not in CATALOGUE:
            raise KeyError(f"error code {code!r} is not in the catalogue")
        self.spec = CATALOGUE[code]
        self.code = code
        self.param = param
        self.status = status if status is not None else self.spec.status
        self.retry_after_s = retry_after_s
        self.details = {"param": param, "hint": "", **details}
        try:
            self.message = self.spec.template.format(**self.details)
        except (KeyError, IndexError):
            self.message = str(details.get("detail", self.spec.template))
        super().__init__(self.message)

    def to_body(self) -> dict[str, Any]:
        """The OpenAI-shaped JSON body of this error."""
        return {"error": {"message": self.message, "type": self.spec.type, "code": self.code, "param": self.param}}

    def headers(self) -> dict[str, str]:
        """HTTP headers that go with the error (Retry-After for retryable overload)."""
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else {}


class ServegateError(Exception):
    """Base of errors that the CLI reports as one line (user-fixable: bad manifest, bad usage)."""


class ManifestError(ServegateError):
    """A manifest could not be loaded or validated; `problems` lists each located message."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class RemoteUnavailable(ServegateError):
    """A remote engine could not be reached, or failed too many requests to be measured (exit 2, never a score)."""
