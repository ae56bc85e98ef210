"""What the note says of the output-length guard (item 6) and of the caching gate's timing audits (item 7).

Both read the public-safe check report: the numbers and the short identifiers (findings, units) survive the
filter, so the rows are built from those, never from the gates' free-text reasons.
"""

from __future__ import annotations

from typing import Any

from servegate.model_cards.markdown_blocks import table


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def output_length_rows(gates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per gate and suite: mean generated tokens (or characters) per item of both sides, the ratio, the band."""
    rows = []
    for gate in gates:
        measurements = gate.get("measurements") or {}
        for group in ("suites", "contract"):  # quality-style gates, and the fallback's output contract
            suites = measurements.get(group)
            if not isinstance(suites, dict):
                continue
            for suite, numbers in suites.items():
                guard = numbers.get("output_length") if isinstance(numbers, dict) else None
                if not isinstance(guard, dict):
                    continue
                rows.append(
                    {
                        "gate": gate.get("name"),
                        "suite": suite,
                        "unit": guard.get("unit"),
                        "n": _num(guard.get("items")),
                        "baseline_mean": _num(guard.get("baseline_mean_tokens")),
                        "candidate_mean": _num(guard.get("candidate_mean_tokens")),
                        "ratio": _num(guard.get("ratio")),
                        "band": [_num(guard.get("band_low")), _num(guard.get("band_high"))],
                        "verdict": guard.get("verdict"),
                    }
                )
    return rows


def timing_audits(report: dict[str, Any] | None) -> dict[str, Any]:
    """The caching gate's black-box timing audits as measured (`ran: false` with the reason when they did not)."""
    gate = next((g for g in (report or {}).get("gates") or [] if g.get("name") == "caching"), None)
    audits = ((gate or {}).get("measurements") or {}).get("timing_audits")
    if not isinstance(audits, dict):
        why = "the caching gate did not run" if gate is None else "the caching gate ran no timing audit"
        return {"ran": False, "why": why}
    repeat, isolation = audits.get("response_cache"), audits.get("isolation")
    return {
        "ran": isinstance(repeat, dict) or isinstance(isolation, dict),
        "caching_verdict": gate.get("verdict") if gate else None,
        "response_cache": repeat if isinstance(repeat, dict) else None,
        "tenant_isolation": isolation if isinstance(isolation, dict) else None,
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
