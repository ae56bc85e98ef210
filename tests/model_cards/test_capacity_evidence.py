"""`gate note` reads `gate bench --json` and `gate plan --json` through their types
(servegate.contracts.report.capacity_evidence): files the real commands wrote are read, others refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

from note_evidence import dump, make_bench, make_plan, make_report, quickstart_sets, run_gate
from support.synthetic_server import Delays, SyntheticServer

from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.model_cards.evidence import Evidence
from servegate.model_cards.items_capacity import capacity_rows

TINY_LLAMA_CONFIG = {"model_type": "llama", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 256}  # fmt: skip


def _sets() -> list[str]:
    return [arg for s in quickstart_sets() for arg in ("--set", s)]


def test_a_bench_written_by_gate_bench_is_read_typed(served: ServedModel, tmp_path: Path) -> None:
    with SyntheticServer(Delays(ttft_ms=20, itl_ms=5)) as server:
        done = run_gate("bench", "--url", server.url, "--rate", "20", "--requests", "12", "--plots", "plots",
                        "--json", "bench.json", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    raw = json.loads((tmp_path / "bench.json").read_text())
    evidence = Evidence.from_files(bench=tmp_path / "bench.json")
    bench = evidence.bench
    assert bench is not None and bench.workload is not None and bench.workload.rate_rps == 20
    assert bench.ttft_ms is not None and bench.ttft_ms.count == 12 and bench.ttft_ms.p50 == raw["ttft_ms"]["p50"]
    assert bench.e2el_ms is not None and bench.e2el_ms.p99_floor == raw["e2el_ms"]["p99_floor"]
    assert bench.throughput is not None and bench.throughput.requests_per_s == raw["throughput"]["requests_per_s"]
    assert bench.requests is not None and (bench.requests.sent, bench.requests.failed) == (12, 0)
    assert [run.rate_rps for run in bench.runs] == [20.0]
    assert bench.plots == raw["plots"] and len(bench.plots) == 2
    measured = {row["metric"]: row["measured"] for row in capacity_rows(served, evidence)}
    assert measured["TTFT p50"] == raw["ttft_ms"]["p50"] and measured["E2E latency p99"] == raw["e2el_ms"]["p99"]
    assert measured["throughput"] == raw["throughput"]["requests_per_s"]


def test_a_memory_only_plan_written_by_gate_plan_is_read_typed(served: ServedModel, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA_CONFIG))
    done = run_gate("plan", "--model-config", str(config), "--memory-budget", "1GiB", "--context", "256",
                    "--json", "plan.json", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    raw = json.loads((tmp_path / "plan.json").read_text())
    evidence = Evidence.from_files(plan=tmp_path / "plan.json")
    plan = evidence.plan
    assert plan is not None and plan.predicted is None and plan.per_replica is None
    assert (plan.kv_bytes_per_token, plan.max_concurrent_sequences) == (
        raw["kv_bytes_per_token"],
        raw["max_concurrent_sequences"],
    )
    assert plan.total_bytes == raw["total_bytes"]
    rows = {row["metric"]: row for row in capacity_rows(served, evidence)}
    assert rows["memory"]["predicted"] == raw["total_bytes"]


def _note(quickstart_copy: Path, tmp_path: Path, *evidence: str) -> list[str]:
    served = load_manifest(quickstart_copy, quickstart_sets())
    report = dump(tmp_path / "check.json", make_report(served))
    out = tmp_path / "SERVING.md"
    done = run_gate("note", str(quickstart_copy), "--report", str(report), *evidence, "-o", str(out), *_sets())
    assert done.returncode == 2, done.stderr
    assert not out.exists()
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


def test_a_malformed_bench_is_refused_in_one_line_naming_the_field(quickstart_copy: Path, tmp_path: Path) -> None:
    bad = make_bench()
    bad["e2el_ms"]["p99"] = "slow"
    bench = dump(tmp_path / "bench.json", bad)
    assert _note(quickstart_copy, tmp_path, "--bench", str(bench)) == [
        f"error: {bench}: not a bench in the format `gate bench MANIFEST --json bench.json` writes "
        "(e2el_ms.p99: Input should be a valid number, unable to parse string as a number)"
    ]


def test_a_malformed_plan_is_refused_in_one_line_naming_the_field(quickstart_copy: Path, tmp_path: Path) -> None:
    bad = {**make_plan(), "per_replica": {"binding": "latency"}}  # no rate
    plan = dump(tmp_path / "plan.json", bad)
    assert _note(quickstart_copy, tmp_path, "--plan", str(plan)) == [
        f"error: {plan}: not a plan in the format `gate plan MANIFEST --json plan.json` writes "
        "(per_replica.rate_rps: Field required)"
    ]
