"""The serving note says which of the length guard and the timing audits ran, and what they measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from note_evidence import make_bench, make_plan, make_report

from servegate.contracts.manifest import ServedModel
from servegate.model_cards.note_files import write_note


def with_audits(served: ServedModel) -> dict[str, Any]:
    """The note evidence's report, with an output-length guard and the caching gate's timing audits."""
    report = make_report(served)
    quant, caching = report["gates"][0], report["gates"][1]
    quant["measurements"]["suites"]["arith"]["output_length"] = {
        "suite": "arith", "items": 200, "unit": "tokens", "baseline_mean_tokens": 5.0, "candidate_mean_tokens": 4.0,
        "ratio": 0.8, "band_low": 0.9, "band_high": 1.1, "verdict": "fail",
    }  # fmt: skip
    caching["measurements"]["timing_audits"] = {
        "response_cache": {"pairs": 8, "declared": True, "other_seed_median_ms": 20.4, "unseen_median_ms": 21.1,
                           "repeat_median_ms": 1.4, "first_send_median_ms": 21.0, "seed_speedup": 14.6,
                           "speedup": 15.4, "max_speedup": 1.5, "p_seed_faster": 0.9, "p_seed_within": 0.001,
                           "p_unseen_faster": 0.001, "p_unseen_within": 0.9, "alpha": 0.0125, "header_hits": 8,
                           "ignore_eos": True, "unseen_unit": "tokens", "unseen_shape_mismatches": 0,
                           "unseen_length_mismatches": 0, "finding": "cache", "verdict": "pass",
                           "reason": "the declared response cache answers repeats"},
        "isolation": {"samples": 40, "prompt_tokens": 55, "tokens_counted_by": "server", "fresh_median_ms": 15.7,
                      "cross_median_ms": 18.5, "own_median_ms": 11.5, "p_own_faster": 0.001, "p_cross_faster": 0.7,
                      "p_cross_slower_than_own": 0.2, "leak_share": None, "alpha": 0.05, "detectable_shift_sd": 0.7,
                      "finding": "inconclusive", "verdict": "warn", "reason": "neither shared nor isolated"},
        "not_run": [],
        "problem": None,
    }  # fmt: skip
    return report


def test_the_note_shows_the_length_guard_and_the_timing_audits(served: ServedModel, tmp_path: Path) -> None:
    out = tmp_path / "SERVING.md"
    note = write_note(served, with_audits(served), out, bench=make_bench(), plan=make_plan())
    [row] = note.items["quality_gate"]["output_length"]
    assert (row["gate"], row["suite"], row["ratio"], row["verdict"]) == ("quantization", "arith", 0.8, "fail")
    audits = note.items["observability"]["timing_audits"]
    assert audits["ran"] and audits["response_cache"]["finding"] == "cache"
    assert audits["tenant_isolation"]["finding"] == "inconclusive" and audits["tenant_isolation"]["samples"] == 40
    text = out.read_text(encoding="utf-8")
    assert "### Output length" in text
    assert "| quantization | arith | tokens | 200 | 5 | 4 | 0.8 | 0.9-1.1 | fail |" in text
    assert "response cache (MLPerf TEST04): **cache**" in text
    assert "another seed in 20.4 ms, against 21.1 ms for never-seen prompts of the same shape" in text
    assert "tenant isolation of prompt caches (Gu et al., ICML 2025): **inconclusive**" in text
    assert "18.5 ms for tenant B" in text


def test_the_note_says_when_no_timing_audit_ran(served: ServedModel, tmp_path: Path) -> None:
    note = write_note(served, make_report(served), tmp_path / "SERVING.md", bench=make_bench(), plan=make_plan())
    assert note.items["observability"]["timing_audits"] == {"ran": False, "why": "the caching gate ran no timing audit"}
    assert "Black-box cache timing audits: not run" in (tmp_path / "SERVING.md").read_text(encoding="utf-8")
