"""The note written from real `gate check` reports (the gates run on the oracle engine of tests/support).

A private suite whose prompts carry a planted secret is evaluated like any other: its items are sent
as requests, int2 quantization makes them fail, and the quantization gate keeps failure examples of
them. None of that text may reach the note; the public suites' numbers and examples must.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from note_evidence import quickstart_sets
from support.oracle_engine import fake_factory

from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.model_cards.note import twin_path
from servegate.model_cards.note_files import write_note

SECRET = "SECRET-TICKET-5521"


@pytest.fixture
def int2_with_private_suite(quickstart_copy: Path) -> ServedModel:
    """The quickstart at int2, 40 items per public suite, plus a private arithmetic suite with a secret in it."""
    rows = [
        {
            "id": f"h-{i}",
            "prompt": f"{SECRET} for customer {i}: {100 + i}+{200 + i}=",
            "reference": f"{300 + 2 * i:04d}",
        }
        for i in range(40)
    ]
    suite = quickstart_copy.parent / "held.jsonl"
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    served = load_manifest(quickstart_copy, [*quickstart_sets(), "runtime.quantization.method=int2-weight"])
    quality = served.quality.model_dump()
    for s in quality["suites"]:
        s["limit"] = 40
    quality["suites"].append({"name": "held", "dataset": "held.jsonl", "public": False})
    return served.with_changes(quality=quality)


def test_note_from_a_real_check_report_keeps_private_text_out(
    int2_with_private_suite: ServedModel, tmp_path: Path
) -> None:
    from servegate.gates.check import run_check
    from servegate.gates.suites.output_cache import OutputCache

    served = int2_with_private_suite
    report = run_check(
        served.reference_form(),
        served,
        mode="reference",
        forced=("quantization",),
        engine_factory=fake_factory(),
        cache=OutputCache(tmp_path / "cache"),
    )
    raw = json.dumps(report.to_dict())
    assert SECRET not in raw  # the gates keep their promise ...
    assert '"suite": "held"' in raw  # ... and the private suite did produce failure examples

    out = tmp_path / "note" / "SERVING.md"
    note = write_note(served, report, out)
    for path in (out, twin_path(out)):
        text = path.read_text(encoding="utf-8")
        assert SECRET not in text and "held" not in text.replace("withheld", "")

    quality = note.items["quality_gate"]
    assert quality["verdict"] == "fail"
    quant = next(g for g in quality["gates"] if g["name"] == "quantization")
    assert quant["verdict"] == "fail" and quant["simulated"] is True
    assert quant["failure_examples"] > quant["public_failure_examples"] > 0
    rows = [r for r in quality["scores"] if r["gate"] == "quantization"]
    assert {r["suite"] for r in rows} == {"arith", "recall", "json"}
    assert all(r["n"] == 40 and r["ci_low"] is not None and r["margin"] is not None for r in rows)
    assert next(r for r in rows if r["suite"] == "arith")["difference"] < -0.03
    assert {e["suite"] for e in quality["examples"]} <= {"arith", "recall", "json"}
