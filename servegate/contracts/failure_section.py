"""The failure policy of a served model: deadline, overload, invalid output and the fallback model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from servegate.contracts.section_base import Section


class Fallback(Section):
    """A second served model that answers when the primary cannot."""

    manifest: str = Field(min_length=1)
    """Path to the fallback's manifest, relative to this file."""
    # mypy infers the lambda's list as list[str], not the list of literals
    triggers: list[Literal["overload", "timeout", "error"]] = Field(default_factory=lambda: ["overload"], min_length=1)  # type: ignore[arg-type]
    """Which failures of the primary are routed to the fallback."""
    boundary: dict[str, float] = Field(default_factory=dict)
    """Lowest score the fallback must keep per metric (e.g. exact_match: 0.6), checked by the fallback gate."""

    @model_validator(mode="before")
    @classmethod
    def _renamed_on(cls, data: Any) -> Any:
        # YAML 1.1 readers (PyYAML, many editors and linters) read the key `on` as the boolean true
        if isinstance(data, dict) and ("on" in data or True in data):
            raise ValueError(
                "`on` is now `triggers` (YAML 1.1 tools read the key `on` as true): rename "
                "failure_policy.fallback.on to failure_policy.fallback.triggers"
            )
        return data

    @field_validator("boundary")
    @classmethod
    def _fractions(cls, value: dict[str, float]) -> dict[str, float]:
        for metric, score in value.items():
            if not 0.0 <= score <= 1.0:
                raise ValueError(f"boundary for {metric!r} is a score between 0 and 1 (got {score})")
        return value


class FailurePolicy(Section):
    """What happens when a request cannot be served as asked: deadline, overload, invalid output."""

    request_timeout_s: float = Field(default=30.0, gt=0, le=86_400)
    """Deadline of every request, from arrival; past it the request ends with deadline_exceeded (504)."""
    max_queue: int = Field(default=256, ge=1, le=1_000_000)
    """Most requests waiting to be scheduled; beyond it the overload policy applies."""
    overload: Literal["reject", "shed-oldest"] = "reject"
    """On a full queue: `reject` the newest request, or `shed-oldest` waiting request to admit it."""
    overload_status: Literal[429, 503] = 429
    """HTTP status of the `overloaded` error."""
    retry_after_s: int = Field(default=1, ge=0, le=3600)
    """Value of the Retry-After header sent with `overloaded`."""
    on_invalid_output: Literal["error", "flag"] = "error"
    """Output that breaks output_schema: answer `invalid_output` (502), or return it with a flag."""
    fallback: Fallback | None = None
    """Fallback model for the declared failures."""
