"""The checks under load in the serving note: which ran, against what, and what they measured.

Read from the (public-safe) check report: the `load` gate's quality and streaming measurements and the
contract gate's structured output under concurrency. The quality-gate item lists every check with its
figures or why it did not run; the observability item says which were measured from the client side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servegate.contracts.report.check_report import CheckReport, GateRecord
from servegate.contracts.report.measurements import ContractMeasurements, LoadMeasurements
from servegate.model_cards.markdown_blocks import table


def _quality(gate: GateRecord) -> tuple[str, str] | None:
    m = gate.measurements
    if not isinstance(m, LoadMeasurements):
        return None
    q = m.quality
    return m.target, (
        f"{q.items} suite items at concurrency {m.concurrency} ({m.requests} requests) against the "
        f"same items sent alone, {q.comparison}: {q.mismatches} differ, {q.refused_under_load} refused under load"
    )


def _streaming(gate: GateRecord) -> tuple[str, str] | None:
    m = gate.measurements
    if not isinstance(m, LoadMeasurements):
        return None
    s = m.streaming
    return m.target, (
        f"{s.streams} streams against their non-streamed twin and {s.answers} answers at concurrency "
        f"{s.concurrency}: {s.twin_mismatches} text, {s.first_token_mismatches} first-token, "
        f"{s.end_of_sequence_violations} end-of-sequence, {s.usage_miscounts} usage and "
        f"{s.max_tokens_exceeded} max_tokens violations (tokens counted by {s.token_count})"
    )


def _structured(gate: GateRecord) -> tuple[str, str] | None:
    m = gate.measurements
    part = m.structured_under_load if isinstance(m, ContractMeasurements) else None
    if part is None:
        return None
    phases = []
    for p in part.phases:
        kind = "streamed" if p.stream else "non-streamed"
        valid = "" if p.validity is None else f"validity {100 * p.validity:.0f} %, "
        phases.append(f"{kind} at {p.concurrency}: {valid}largest answer {p.bytes_max} bytes")
    limit = part.max_output_bytes
    return part.target, "; ".join(phases) + (f" (limit {limit} bytes)" if limit is not None else "")


Summary = Callable[[GateRecord], "tuple[str, str] | None"]
"""What a check under load measured in a gate's result: (where, one line), or None when it did not measure it."""

CHECKS: tuple[tuple[str, str, Summary], ...] = (
    ("quality under load", "load", _quality),
    ("streaming consistency under load", "load", _streaming),
    ("structured output under concurrency", "contract", _structured),
)
"""(check, gate, summary)."""


def load_checks(report: CheckReport | None) -> list[dict[str, Any]]:
    """One row per check under load: whether it ran, its gate's verdict, where, and what it measured."""
    rows = []
    for check, name, summary in CHECKS:
        gate = report.gate(name) if report is not None else None
        measured = summary(gate) if gate is not None else None
        if gate is None:
            why = f"not run: the {name} gate is not in the report"
        elif gate.verdict in ("skipped", "unavailable"):
            why = f"not run: {name} gate {gate.verdict} ({gate.reason})"
        elif measured is None:
            why = (
                "not run: no postprocess.output_schema or max_output_bytes declared"
                if name == "contract"
                else "not run: no generation suite to sample"
            )
        else:
            why = ""
        rows.append(
            {
                "check": check,
                "gate": name,
                "ran": not why,
                "verdict": gate.verdict if gate is not None and not why else None,
                "target": measured[0] if measured is not None else None,
                "measured": measured[1] if measured is not None and not why else why,
            }
        )
    return rows


def render_load_checks(rows: list[dict[str, Any]], h: str) -> list[str]:
    """The quality-gate item's table of the checks under load."""
    if not rows:
        return []
    intro = "Checked over HTTP, as a client sees the served model (after MLPerf's TEST01 and TEST06)."
    out = [f"{h}# Under load", "", intro, ""]
    out += table(
        ("Check", "Gate", "Ran", "Verdict", "Measured"),
        ((r["check"], r["gate"], r["ran"], r["verdict"], r["measured"]) for r in rows),
    )
    return out


def client_side(rows: list[dict[str, Any]]) -> list[str]:
    """The checks that ran from the client side (for the observability item)."""
    return [r["check"] for r in rows if r["ran"]]
