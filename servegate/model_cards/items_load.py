"""The checks under load in the serving note: which ran, against what, and what they measured.

Read from the (public-safe) check report: the `load` gate's quality and streaming measurements and the
contract gate's structured output under concurrency. The quality-gate item lists every check with its
figures or why it did not run; the observability item says which were measured from the client side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servegate.model_cards.markdown_blocks import table

Summary = Callable[[dict[str, Any], dict[str, Any]], str]


def _quality(part: dict[str, Any], gate: dict[str, Any]) -> str:
    return (
        f"{part['items']} suite items at concurrency {gate['concurrency']} ({gate['requests']} requests) against the "
        f"same items sent alone, {part['comparison']}: {part['mismatches']} differ, "
        f"{part['refused_under_load']} refused under load"
    )


def _streaming(part: dict[str, Any], gate: dict[str, Any]) -> str:
    return (
        f"{part['streams']} streams against their non-streamed twin and {part['answers']} answers at concurrency "
        f"{part['concurrency']}: {part['twin_mismatches']} text, {part['first_token_mismatches']} first-token, "
        f"{part['end_of_sequence_violations']} end-of-sequence, {part['usage_miscounts']} usage and "
        f"{part['max_tokens_exceeded']} max_tokens violations (tokens counted by {part['token_count']})"
    )


def _structured(part: dict[str, Any], gate: dict[str, Any]) -> str:
    phases = []
    for p in part["phases"]:
        kind = "streamed" if p["stream"] else "non-streamed"
        valid = "" if p["validity"] is None else f"validity {100 * p['validity']:.0f} %, "
        phases.append(f"{kind} at {p['concurrency']}: {valid}largest answer {p['bytes_max']} bytes")
    limit = part.get("max_output_bytes")
    return "; ".join(phases) + (f" (limit {limit} bytes)" if limit is not None else "")


CHECKS: tuple[tuple[str, str, str, Summary], ...] = (
    ("quality under load", "load", "quality", _quality),
    ("streaming consistency under load", "load", "streaming", _streaming),
    ("structured output under concurrency", "contract", "structured_under_load", _structured),
)
"""(check, gate, key of its measurements, summary)."""


def load_checks(report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One row per check under load: whether it ran, its gate's verdict, where, and what it measured."""
    gates = {g["name"]: g for g in (report or {}).get("gates") or []}
    rows = []
    for check, name, key, summary in CHECKS:
        gate = gates.get(name)
        measured = (gate or {}).get("measurements") or {}
        part = measured.get(key) if isinstance(measured.get(key), dict) else None
        if gate is None:
            why = f"not run: the {name} gate is not in the report"
        elif gate["verdict"] in ("skipped", "unavailable"):
            why = f"not run: {name} gate {gate['verdict']} ({gate['reason']})"
        elif part is None:
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
                "ran": part is not None and not why,
                "verdict": gate["verdict"] if gate is not None and not why else None,
                "target": measured.get("target") or (part or {}).get("target"),
                "measured": summary(part, measured) if part is not None and not why else why,
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
