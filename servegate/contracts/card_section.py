"""The manifest's `card` section: the served model's public identity for the serving note (never fingerprinted)."""

from __future__ import annotations

from servegate.contracts.section_base import Section


class Card(Section):
    """Public identity of the served model for the serving note (never fingerprinted)."""

    public_name: str | None = None
    """Name the model is published under."""
    model_class: str | None = None
    """Generic model class when the name is not public (e.g. "1M-parameter Llama-architecture LM")."""
    intended_use: str | None = None
    """What the served model is for."""
    observability: str = (
        "Aggregate metrics only (request counts by status, latency histograms, token counts, queue depth, "
        "cache hits); raw request and response text is never logged."
    )
    """Statement of what is observed in production; raw input is never logged."""
    license: str | None = None
    """Licence of the weights."""
