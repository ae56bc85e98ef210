"""Checklist item 7: what is observed in production (aggregate metrics only) and that raw input is not logged."""

from __future__ import annotations

import re
from typing import Any

from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.check_report import CheckReport
from servegate.model_cards.evidence import missing
from servegate.model_cards.items_audits import timing_audits
from servegate.model_cards.items_load import client_side, load_checks

# "never logged", "is not logged", "not stored or logged": the statement the checklist requires.
_NOT_LOGGED = re.compile(r"\b(not|never)\b[^.;]*\blogged\b|\bno\b[^.;]*\b(is|are)\s+logged\b", re.IGNORECASE)
_SERIES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def exported_metrics() -> list[dict[str, Any]]:
    """The server's Prometheus metrics (name, series as exported, type, help), read from its own registry."""
    from servegate.runtime.types import EngineStats
    from servegate.server.prometheus_metrics import ServerMetrics

    registry = ServerMetrics(lambda: EngineStats()).registry
    return [
        {
            "name": family.name,
            "series": [family.name + suffix for suffix in _SERIES.get(family.type, ("",))],
            "type": family.type,
            "help": family.documentation,
        }
        for family in registry.collect()
    ]


def observability(served: ServedModel, report: CheckReport | None = None) -> dict[str, Any]:
    """Item 7: the aggregate metrics exported, the statement that raw input is not logged, which checks
    measured the served model from the client side (no internal counter), and what the caching gate's timing
    audits found a client can observe (`report`: the public-safe check report)."""
    statement = served.card.observability.strip()
    if not statement:
        raise missing("observability", "set card.observability: what is observed, and that raw input is not logged")
    if not _NOT_LOGGED.search(statement):
        raise missing(
            "observability (raw input statement)",
            "card.observability must say that raw request text is not logged "
            '(e.g. "raw request and response text is never logged")',
        )
    try:
        metrics = exported_metrics()
    except ImportError:  # a build without the server: the statement stands, the list cannot be read
        metrics = []
    return {
        "statement": statement,
        "raw_input_logged": False,
        "metrics_endpoint": "GET /metrics (Prometheus text format)",
        "label_values": "closed sets only (endpoint, HTTP status): no request text or tenant id becomes a label",
        "metrics": metrics,
        "timing_audits": timing_audits(report),
        "client_side_checks": client_side(load_checks(report)),
    }
