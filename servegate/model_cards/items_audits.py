"""What the note says of the output-length guard (item 6) and of the caching gate's timing audits (item 7).

Both read the public-safe check report: the numbers and the short identifiers (findings, units) survive the
filter, so the rows are built from those, never from the gates' free-text reasons.
"""

from __future__ import annotations

from typing import Any

from servegate.contracts.report.check_report import CheckReport, GateRecord
from servegate.contracts.report.measurements import CachingMeasurements
from servegate.contracts.report.quality import SuiteScores
from servegate.contracts.report.quality_measurements import (
    FallbackMeasurements,
    QualityMeasurements,
    QuantizationMeasurements,
    TruncationMeasurements,
)
from servegate.model_cards.markdown_blocks import table


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def suite_scores(gate: GateRecord) -> dict[str, SuiteScores]:
    """Suite name -> its paired comparison, for the gates that compare suites (the fallback: its output contract)."""
    m = gate.measurements
    if isinstance(m, QualityMeasurements | QuantizationMeasurements | TruncationMeasurements):
        return m.suites or {}
    if isinstance(m, FallbackMeasurements):
        return m.contract
    return {}


def output_length_rows(gates: list[GateRecord]) -> list[dict[str, Any]]:
    """Per gate and suite: mean generated tokens (or characters) per item of both sides, the ratio, the band."""
    return [
        {
            "gate": gate.name,
            "suite": suite,
            "unit": guard.unit,
            "n": float(guard.items),
            "baseline_mean": guard.baseline_mean_tokens,
            "candidate_mean": guard.candidate_mean_tokens,
            "ratio": guard.ratio,
            "band": [guard.band_low, guard.band_high],
            "verdict": guard.verdict,
        }
        for gate in gates
        for suite, scores in suite_scores(gate).items()
        if (guard := scores.output_length) is not None
    ]


def timing_audits(report: CheckReport | None) -> dict[str, Any]:
    """The caching gate's black-box timing audits as measured (`ran: false` with the reason when they did not)."""
    gate = report.gate("caching") if report is not None else None
    audits = gate.measurements.timing_audits if gate and isinstance(gate.measurements, CachingMeasurements) else None
    if audits is None:
        why = "the caching gate did not run" if gate is None else "the caching gate ran no timing audit"
        return {"ran": False, "why": why}
    repeat, isolation = audits.response_cache, audits.isolation
    return {
        "ran": repeat is not None or isolation is not None,
        "caching_verdict": gate.verdict if gate else None,
        "response_cache": repeat.model_dump(mode="json") if repeat is not None else None,
        "tenant_isolation": isolation.model_dump(mode="json") if isolation is not None else None,
    }


def render_output_length(rows: list[dict[str, Any]], h: str) -> list[str]:
    """Item 6's output-length table (empty when no comparison ran)."""
    if not rows:
        return []
    out = [f"{h}# Output length", "", "Mean generated length per item, candidate against baseline, on the items "
           "both answered; outside the band the comparison fails even when its metrics hold.", ""]  # fmt: skip
    out += table(
        ("Gate", "Suite", "Unit", "n", "Baseline", "Candidate", "Ratio", "Band", "Verdict"),
        (
            (
                r["gate"],
                r["suite"],
                r["unit"],
                None if r["n"] is None else int(r["n"]),
                r["baseline_mean"],
                r["candidate_mean"],
                r["ratio"],
                f"{r['band'][0]:g}-{r['band'][1]:g}" if None not in r["band"] else None,
                r["verdict"],
            )  # fmt: skip
            for r in rows
        ),
    )
    return out


def render_timing_audits(audits: dict[str, Any]) -> list[str]:
    """Item 7's lines on what a client can time: a response cache, a prompt cache shared across tenants."""
    if not audits.get("ran"):
        return [f"Black-box cache timing audits: not run ({audits.get('why', 'no caching gate result')}).", ""]
    out = ["Black-box cache timing audits (the caching gate, measured over HTTP as any client could):", ""]
    repeat = audits.get("response_cache")
    if repeat:
        out.append(
            f"- response cache (MLPerf TEST04): **{repeat.get('finding')}**; exact repeats answered in "
            f"{repeat.get('repeat_median_ms')} ms (median), the same prompt with another seed in "
            f"{repeat.get('other_seed_median_ms')} ms, against {repeat.get('unseen_median_ms')} ms for never-seen "
            f"prompts of the same shape ({repeat.get('speedup')}x, limit {repeat.get('max_speedup')}x, "
            f"{repeat.get('pairs')} rounds, declared: {'yes' if repeat.get('declared') else 'no'})"
        )
    isolation = audits.get("tenant_isolation")
    if isolation:
        out.append(
            f"- tenant isolation of prompt caches (Gu et al., ICML 2025): **{isolation.get('finding')}**; time to "
            f"first token {isolation.get('cross_median_ms')} ms for tenant B on tenant A's prompts, "
            f"{isolation.get('fresh_median_ms')} ms fresh, {isolation.get('own_median_ms')} ms for A's own repeats "
            f"({isolation.get('samples')} per side, {isolation.get('prompt_tokens')}-token prompts, Mann-Whitney "
            f"p = {_p(isolation.get('p_cross_faster'))} that B is faster than fresh)"
        )
    else:
        out.append("- tenant isolation: not run (a single tenant: preprocess.tenant_from is none)")
    return out + [""]


def _p(value: Any) -> str:
    number = _num(value)
    return "n/a" if number is None else f"{number:.2g}"
