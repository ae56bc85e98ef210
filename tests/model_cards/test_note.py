"""A complete serving note from the quickstart example: seven items, Markdown + JSON twin that parse back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from note_evidence import dump, make_bench, make_plan, make_report

from servegate.contracts.errors import CATALOGUE
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.capacity_evidence import BenchEvidence
from servegate.model_cards.note import ITEMS, ServingNote, twin_path
from servegate.model_cards.note_files import write_note
from servegate.model_cards.render_markdown import read_metadata


def test_quickstart_note_has_all_seven_items_and_parses_back(served: ServedModel, tmp_path: Path) -> None:
    out = tmp_path / "SERVING.md"
    note = write_note(served, make_report(served), out, bench=make_bench(), plan=make_plan())

    twin = json.loads(twin_path(out).read_text(encoding="utf-8"))
    assert list(twin["items"]) == [key for key, _ in ITEMS]
    back = ServingNote.from_json(twin_path(out).read_text(encoding="utf-8"))
    assert back == note
    assert back.to_dict() == twin

    meta = read_metadata(out.read_text(encoding="utf-8"))
    assert meta == json.loads(json.dumps(note.metadata()))
    assert meta["fingerprint"] == served.fingerprint


def test_items_carry_the_manifest_and_the_evidence(served: ServedModel, tmp_path: Path) -> None:
    note = write_note(served, make_report(served), tmp_path / "SERVING.md", bench=make_bench(), plan=make_plan())
    items = note.items

    identity = items["model_identity"]
    assert identity["public_name"] == "servegate/tiny-primary"
    assert identity["fingerprint"] == served.fingerprint and identity["version"] == "1.0.0"
    assert identity["weight_checksums"] and all(len(d) == 64 for d in identity["weight_checksums"].values())

    contract = items["input_contract"]
    assert contract["limits"]["max_input_tokens"] == 64 and contract["limits"]["max_payload_bytes"] == 65536
    assert contract["truncation"]["policy"] == "left"
    client_codes = {code for code, spec in CATALOGUE.items() if spec.client_error}
    assert {e["code"] for e in contract["errors"]} == client_codes
    assert {e["code"]: e["status"] for e in contract["errors"]}["payload_too_large"] == 413
    assert contract["request_schemas"]["completions"]["properties"]["model"]["const"] == "quickstart"

    output = items["output_contract"]
    assert output["logprobs_offered"] is True
    assert output["error_format"]["example"]["error"]["code"] == "input_too_long"
    assert {e["code"]: e["status"] for e in output["errors"]}["overloaded"] == 429

    assert items["workload_shape"]["rate_rps"] == 24 and items["workload_shape"]["response_mode"] == "sync"

    rows = {r["metric"]: r for r in items["capacity_target"]["rows"]}
    assert rows["E2E latency p95"] == {**rows["E2E latency p95"], "target": 5000, "predicted": 140, "measured": 150}
    assert rows["E2E latency p95"]["met"] is True
    assert rows["throughput"]["unit"] == "requests/s" and rows["throughput"]["measured"] == 4.8
    assert rows["memory"]["target"] == 2**30 and rows["memory"]["predicted"] == 80_000_000

    plan = items["capacity_target"]["plan"]
    assert plan["policy"] == {"kv_blocks": 4096, "mode": "continuous", "max_batch_size": 32}
    assert plan["binding_constraint"] == "e2e_ms.p99: latency at 5 requests/s" and plan["bound"] == "latency-bound"

    quality = items["quality_gate"]
    assert quality["verdict"] == "pass"
    arith = next(r for r in quality["scores"] if r["suite"] == "arith")
    assert (arith["metric"], arith["n"], arith["margin"]) == ("exact_match", 200, 0.03)
    assert (arith["difference"], arith["ci_low"], arith["ci_high"]) == pytest.approx((-0.01, -0.03, 0.01))
    assert {r["suite"] for r in quality["agreement"]} == {"arith", "recall"}
    quantization = next(o for o in quality["optimizations"] if o["field"] == "runtime.quantization.method")
    assert quantization["served"] == "int8-weight" and quantization["simulated"] is False
    assert quality["examples"][0]["candidate"] == "43"

    obs = items["observability"]
    assert obs["raw_input_logged"] is False
    assert "servegate_requests_total" in {s for m in obs["metrics"] for s in m["series"]}


def test_plots_are_drawn_from_bench_json_and_embedded(served: ServedModel, tmp_path: Path) -> None:
    out = tmp_path / "SERVING.md"
    note = write_note(served, make_report(served), out, bench=make_bench())
    assert [p["path"] for p in note.plots] == ["SERVING.latency-cdf.png", "SERVING.throughput-vs-load.png"]
    markdown = out.read_text(encoding="utf-8")
    for plot in note.plots:
        assert (tmp_path / plot["path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({plot['path']})" in markdown


def test_bench_pngs_are_copied_when_the_bench_wrote_them(served: ServedModel, tmp_path: Path) -> None:

    from servegate.model_cards.evidence import Evidence
    from servegate.model_cards.note_files import write_note_files
    from servegate.model_cards.plots import draw_latency_cdf

    own = draw_latency_cdf(BenchEvidence.model_validate({"e2el_ms": {"p50": 1, "p95": 2, "p99": 3}}))
    (tmp_path / "bench-latency-cdf.png").write_bytes(own)
    bench = {**make_bench(), "plots": ["bench-latency-cdf.png"]}  # as `gate bench --plots` lists them
    report = make_report(served)
    evidence = Evidence.from_files(report=dump(tmp_path / "check.json", report), bench=dump(tmp_path / "b.json", bench))
    note = write_note_files(served, evidence, tmp_path / "out" / "SERVING.md")
    assert (tmp_path / "out" / note.plots[0]["path"]).read_bytes() == own
    assert (tmp_path / "out" / note.plots[1]["path"]).read_bytes()[:4] == b"\x89PNG"  # drawn here


def test_write_note_takes_a_gate_report_object(served: ServedModel, tmp_path: Path) -> None:
    from servegate.contracts.report.measurements import CachingMeasurements
    from servegate.gates.result import GateReport, GateResult

    measured = CachingMeasurements(caches=["prefix cache"], tenants_identified=True, shared_across_tenants=[])
    report = GateReport(
        baseline={"name": served.name, "fingerprint": "x", "form": "reference"},
        candidate={"name": served.name, "version": served.version, "fingerprint": served.fingerprint},
        gates=[GateResult("caching", "pass", "no cross-tenant hits", measured.updated(tenant_b_extra_hits=0))],
    )
    note = write_note(served, report, tmp_path / "SERVING.md")
    assert note.verdict == "pass"
    assert [g["name"] for g in note.items["quality_gate"]["gates"]] == ["caching"]


def test_bench_plot_paths_as_gate_bench_records_them(
    served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gate bench --plots bench-plots` lists paths relative to where it ran, with its own file names."""
    from servegate.model_cards.evidence import Evidence
    from servegate.model_cards.note_files import write_note_files
    from servegate.model_cards.plots import draw_latency_cdf, draw_throughput_vs_load

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bench-plots").mkdir()
    typed = BenchEvidence.model_validate(make_bench())
    cdf, rate = draw_latency_cdf(typed), draw_throughput_vs_load(typed)
    (tmp_path / "bench-plots" / "latency_cdf.png").write_bytes(cdf)
    (tmp_path / "bench-plots" / "rate_curves.png").write_bytes(rate)
    (tmp_path / "results").mkdir()
    bench = {**make_bench(), "plots": ["bench-plots/latency_cdf.png", "bench-plots/rate_curves.png"]}
    evidence = Evidence.from_files(
        report=dump(tmp_path / "results" / "check.json", make_report(served)),
        bench=dump(tmp_path / "results" / "bench.json", bench),
    )
    note = write_note_files(served, evidence, tmp_path / "SERVING.md")
    assert [(tmp_path / p["path"]).read_bytes() for p in note.plots] == [cdf, rate]


def test_capacity_gate_measurements_fill_the_measured_column(served: ServedModel, tmp_path: Path) -> None:
    bench = make_bench()
    report = make_report(served)
    report["gates"].append(
        {
            "name": "capacity",
            "verdict": "pass",
            "reason": "3 target(s) met at 5 requests/s",
            "measurements": {
                **{k: bench[k] for k in ("ttft_ms", "tpot_ms", "e2el_ms", "throughput", "goodput", "requests")},
                "targets": [],
                "memory_total_bytes": None,
                "peak_memory_bytes": 600 * 2**20,  # the server process the gate ran
                "machine_speed": None,
                "client_limited": False,
                "load_average": None,
                "paired": False,
            },
        }
    )
    note = write_note(served, report, tmp_path / "SERVING.md")
    capacity = note.items["capacity_target"]
    assert capacity["sources"]["measured"] == "gate check (capacity gate)"
    rows = {r["metric"]: r for r in capacity["rows"]}
    assert rows["E2E latency p99"]["measured"] == 300 and rows["throughput"]["measured"] == 4.8
    assert rows["memory"]["measured"] == 600 * 2**20
    assert note.plots == []  # plots come with --bench only


def test_the_note_says_in_words_what_the_bench_figures_support(served: ServedModel, tmp_path: Path) -> None:
    """A bench's intervals and floors become sentences: p99 of 60 requests is not estimable below 662."""
    from servegate.capacity.bench.percentiles import interval_fields

    bench = make_bench()
    bench["e2el_ms"].update(interval_fields([70.0 + i for i in range(60)], (50, 95, 99)))
    bench["client_limited"] = True
    note = write_note(served, make_report(served), tmp_path / "SERVING.md", bench=bench)
    supported = note.items["capacity_target"]["supported"]
    e2e_p99 = next(s for s in supported if s.startswith("p99 E2E latency"))
    assert "60 requests; too few for a 95% interval, which needs 368" in e2e_p99
    assert e2e_p99.endswith("p99 not estimable below 662 requests")
    assert any(s.startswith("p50 E2E latency 70 ms (95% interval") for s in supported)
    assert any("client fell behind" in s for s in supported)
    text = (tmp_path / "SERVING.md").read_text()
    assert "What the measurements support:" in text and f"- {e2e_p99}" in text
