"""Planted secrets in a private suite and in requests never reach the note, its JSON twin or the model card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from note_evidence import CACHING, gate, make_report, next_token, quickstart_sets, score

from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.model_cards.evidence import NoteError
from servegate.model_cards.note import twin_path
from servegate.model_cards.note_files import write_note

PRIVATE_PROMPT = "Internal ticket SECRET-PROMPT-7Q: the launch code is 4711"
PRIVATE_REFERENCE = "SECRET-REFERENCE-ZETA-99"
TENANT = "SECRET-TENANT-acme"
REQUEST_TEXT = "SECRET-REQUEST hello from the customer"
SECRETS = ("SECRET-PROMPT-7Q", PRIVATE_REFERENCE, TENANT, "SECRET-REQUEST", "held_out")


@pytest.fixture
def private_served(quickstart_copy: Path) -> ServedModel:
    """The quickstart with a fourth suite, `held_out`, that is not public."""
    rows = [{"id": f"h-{i}", "prompt": f"{PRIVATE_PROMPT} #{i}", "reference": PRIVATE_REFERENCE} for i in range(3)]
    suite_file = quickstart_copy.parent / "held_out.jsonl"
    suite_file.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    served = load_manifest(quickstart_copy, quickstart_sets())
    quality = served.quality.model_dump()
    quality["suites"].append({"name": "held_out", "dataset": "held_out.jsonl", "public": False})
    return served.with_changes(quality=quality)


def _leaky_report(served: ServedModel) -> dict:
    """A report that breaks every promise: private texts, tenant ids and request text all over it, in the
    schema's own text fields and in a third-party gate's free-form measurements."""
    report = make_report(served)
    quant = report["gates"][0]
    held_out = score(0.7, 0.6)
    held_out["reason"] = f"worst item: {PRIVATE_REFERENCE}"
    quant["measurements"]["suites"]["held_out"] = {"items": 3, "exact_match": held_out}
    quant["measurements"]["next_token"]["held_out"] = next_token(0.5, 0.9)
    quant["evidence"].append(
        {
            "suite": "held_out",
            "id": "h-1",
            "prompt": f"{PRIVATE_PROMPT} #1",
            "reference": PRIVATE_REFERENCE,
            "baseline": PRIVATE_REFERENCE,
            "candidate": "SECRET-PROMPT-7Q wrong",
        }
    )
    report["gates"][1] = gate(
        "caching",
        "pass",
        f"probes from '{TENANT}' with \"{REQUEST_TEXT}\" got 0 hits in 'held_out'",
        {**CACHING, "caches": [TENANT], "shared_across_tenants": [TENANT]},
        [{"id": "probe-1", "prompt": REQUEST_TEXT, "tenant": TENANT, "user": TENANT}],
    )
    report["gates"].append(
        gate(
            "acme-probe",  # a third party's gate: its measurements are free-form
            "pass",
            "ok",
            {
                "per_suite": [
                    {"suite": "held_out", "n": 3, "difference": -0.1, "example": PRIVATE_PROMPT},
                    {"suite": "arith", "n": 200, "difference": -0.01},
                ],
                "probe_tenant": TENANT,
                "hits_by_tenant": {TENANT: 0},
                "last_request": REQUEST_TEXT,
                "label": TENANT,
                TENANT: 1,
            },
        )
    )
    return report


def test_planted_secrets_never_appear(private_served: ServedModel, tmp_path: Path) -> None:
    card = tmp_path / "README.md"
    card.write_text("# Card\n", encoding="utf-8")
    out = tmp_path / "SERVING.md"
    note = write_note(private_served, _leaky_report(private_served), out, model_card=card)

    written = {p.name: p.read_text(encoding="utf-8") for p in (out, twin_path(out), card)}
    for name, text in written.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret!r} leaked into {name}"

    quality = note.items["quality_gate"]
    quant = quality["gates"][0]
    assert (quant["failure_examples"], quant["public_failure_examples"]) == (2, 1)
    assert [e["suite"] for e in quality["examples"]] == ["arith"]  # public failure examples are still shown
    assert "12+30=" in written["SERVING.md"]
    assert {r["suite"] for r in quality["scores"]} == {"arith", "recall", "json"}
    assert "private-1" in quality["gates"][1]["reason"]  # the private suite is named by its alias only


def test_private_evidence_keeps_only_ids_and_lengths(private_served: ServedModel) -> None:
    from servegate.contracts.report.check_report import CheckReport
    from servegate.model_cards.public_safety import PublicFilter

    safe = PublicFilter(private_served).report(CheckReport.model_validate(_leaky_report(private_served)))
    private = safe.gates[0].evidence[1].model_dump()
    assert private == {
        "suite": "private-1",
        "id": "h-1",
        "prompt_chars": len(PRIVATE_PROMPT) + 3,
        "reference_chars": len(PRIVATE_REFERENCE),
        "baseline_chars": len(PRIVATE_REFERENCE),
        "candidate_chars": len("SECRET-PROMPT-7Q wrong"),
    }
    assert [e.model_dump() for e in safe.gates[1].evidence] == [
        {"suite": None, "id": "probe-1", "prompt_chars": len(REQUEST_TEXT)}
    ]
    assert "held_out" not in safe.gates[0].measurements.model_dump_json()  # its suite scores and divergence
    assert safe.gates[3].measurements.model_dump()["per_suite"] == [{"suite": "arith", "n": 200, "difference": -0.01}]


def test_private_text_smuggled_past_the_filters_stops_the_note(private_served: ServedModel, tmp_path: Path) -> None:
    report = make_report(private_served)
    report["gates"][0]["reason"] = f"worst item was {PRIVATE_PROMPT} #2 with no quotes around it"
    with pytest.raises(NoteError, match="suite private-1 .* nothing was written"):
        write_note(private_served, report, tmp_path / "SERVING.md")
    assert not (tmp_path / "SERVING.md").exists() and not (tmp_path / "SERVING.json").exists()
