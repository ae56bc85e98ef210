"""The capacity plan in one plain sentence for the serving note."""

from __future__ import annotations

from typing import Any

from servegate.contracts.report.capacity_evidence import PlanEvidence
from servegate.model_cards.items_capacity import capacity_sentence


def plan(per_replica: dict[str, Any], replicas: dict[str, Any] | None = None) -> PlanEvidence:
    """The parts of a `gate plan --json` file the sentence reads, through the note's reader."""
    return PlanEvidence.model_validate(
        {
            "targets": [{"name": "e2e_ms.p99", "target": 2000.0, "predicted": 1800.0, "unit": "ms", "met": True}],
            "per_replica": per_replica,
            "replicas": replicas,
        }
    )


LATENCY_BOUND = {"rate_rps": 3.1, "low_rps": 2.8, "high_rps": 3.4, "level": 0.6, "capacity_rps": 4.0,
                 "binding": "latency", "binding_target": "e2e_ms.p99", "detail": "above 3.1 requests/s"}  # fmt: skip


def test_one_replica_its_interval_the_replicas_and_what_binds() -> None:
    replicas = {"replicas": 4, "total_rps": 12.0, "per_replica_rps": 3.1, "source": "capacity.total_rate_rps"}
    assert capacity_sentence(plan(LATENCY_BOUND, replicas)) == (
        "One replica holds 3.1 requests/s of this workload with p99 E2E under 2 s (60% interval 2.8-3.4); "
        "4 replicas for 12 requests/s. The binding constraint is latency (e2e_ms.p99)."
    )


def test_throughput_binds_without_a_latency_target() -> None:
    per = {"rate_rps": 40.0, "low_rps": 40.0, "high_rps": 40.0, "capacity_rps": 40.0, "binding": "throughput",
           "binding_target": None, "detail": "no latency target"}  # fmt: skip
    assert capacity_sentence(plan(per)) == (
        "One replica holds 40 requests/s of this workload. The binding constraint is throughput (the replica's "
        "capacity)."
    )


def test_memory_binds_when_the_kv_pool_runs_full() -> None:
    sentence = capacity_sentence(plan({**LATENCY_BOUND, "binding": "memory"}))
    assert sentence is not None and sentence.endswith("The binding constraint is memory (the KV pool).")


def test_an_unreachable_target_says_no_load_meets_it() -> None:
    per = {**LATENCY_BOUND, "rate_rps": 0.0, "low_rps": 0.0, "high_rps": 0.0,
           "detail": "e2e_ms.p99 is missed even at 0.05 requests/s: no rate meets it on this replica"}  # fmt: skip
    assert capacity_sentence(plan(per)) == (
        "No load meets the targets on one replica: e2e_ms.p99 is missed even at 0.05 requests/s: no rate meets it "
        "on this replica."
    )


def test_no_sentence_without_per_replica_figures() -> None:
    assert capacity_sentence(PlanEvidence()) is None
    assert capacity_sentence(None) is None


def test_the_notes_plan_summary_carries_the_sentence() -> None:
    from servegate.model_cards.items_capacity import _plan_summary

    summary = _plan_summary(plan(LATENCY_BOUND))
    assert summary is not None and summary["sentence"].startswith("One replica holds 3.1 requests/s")
