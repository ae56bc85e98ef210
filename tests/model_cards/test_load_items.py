"""The serving note says which checks under load ran, against what, and what they measured."""

from __future__ import annotations

from typing import Any

from note_evidence import check_report

from servegate.contracts.report.check_report import CheckReport
from servegate.model_cards.items_load import client_side, load_checks, render_load_checks

LOAD = {
    "name": "load",
    "verdict": "fail",
    "reason": "streaming under load ...",
    "measurements": {
        "target": "servegate's server (in process)",
        "concurrency": 8,
        "concurrency_from": "batching.max_batch_size",
        "requests": 54,
        "load_phase_s": 2.5,
        "throughput_rps": 21.6,
        "quality": {
            "comparison": "token-exact",
            "items": 18,
            "mismatches": 0,
            "mismatch_rate": 0.0,
            "refused_under_load": 0,
        },  # fmt: skip
        "streaming": {
            "concurrency": 8,
            "streams": 18,
            "answers": 54,
            "refused": 0,
            "twin_mismatches": 18,
            "first_token_mismatches": 18,
            "end_of_sequence_violations": 0,
            "usage_miscounts": 0,
            "max_tokens_exceeded": 0,
            "token_count": "tokenizer",
        },  # fmt: skip
    },
}
PHASES = [{"concurrency": c, "stream": s, "answers": 4, "valid": int(4 * v), "validity": v, "bytes_max": 14,
           "bytes_mean": 12.0, "over_limit": 0}
          for c, s, v in [(1, False, 1.0), (1, True, 1.0), (8, False, 0.25), (8, True, 0.5)]]  # fmt: skip
STRUCTURED = {"target": "servegate's server (in process)", "margin": 0.05, "max_output_bytes": 64, "phases": PHASES}


def report(*gates: dict[str, Any]) -> CheckReport:
    return CheckReport.model_validate(check_report([{"evidence": [], **g} for g in gates]))


def test_every_check_that_ran_is_listed_with_its_figures() -> None:
    contract = {"name": "contract", "verdict": "fail", "reason": "x",
                "measurements": {"structured_under_load": STRUCTURED}}  # fmt: skip
    rows = load_checks(report(LOAD, contract))
    assert [r["ran"] for r in rows] == [True, True, True]
    assert "18 suite items at concurrency 8 (54 requests)" in rows[0]["measured"] and "0 differ" in rows[0]["measured"]
    assert "18 text, 18 first-token" in rows[1]["measured"]
    assert "non-streamed at 8: validity 25 %" in rows[2]["measured"] and "(limit 64 bytes)" in rows[2]["measured"]
    assert rows[0]["target"] == "servegate's server (in process)"
    assert client_side(rows) == [r["check"] for r in rows]
    text = "\n".join(render_load_checks(rows, "##"))
    assert "### Under load" in text and "streaming consistency under load" in text


def test_a_check_that_did_not_run_says_why() -> None:
    skipped = {**LOAD, "verdict": "skipped", "reason": "no watched field changed", "measurements": {}}
    contract = {"name": "contract", "verdict": "pass", "reason": "ok", "measurements": {"probes": 15}}
    rows = load_checks(report(skipped, contract))
    assert [r["ran"] for r in rows] == [False, False, False]
    assert rows[0]["measured"] == "not run: load gate skipped (no watched field changed)"
    assert rows[2]["measured"] == "not run: no postprocess.output_schema or max_output_bytes declared"
    assert client_side(rows) == []
    assert load_checks(None)[0]["measured"] == "not run: the load gate is not in the report"
