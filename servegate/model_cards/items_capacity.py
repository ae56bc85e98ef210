"""Checklist items 4-5: the workload shape and the capacity target, declared, predicted and measured.

Targets come from the manifest (`capacity.targets`), predictions from `gate plan --json`, measurements
from `gate bench --json`. Each row shows all three side by side; a cell is None where that source is absent.
"""

from __future__ import annotations

import math
from typing import Any

from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.capacity_evidence import (
    BenchEvidence,
    Goodput,
    LatencyFigures,
    PlanEvidence,
    PlanPrediction,
    RequestCounts,
    Throughput,
)
from servegate.model_cards.evidence import Evidence, missing

LATENCIES = (("ttft_ms", "TTFT", "ttft_ms"), ("tpot_ms", "TPOT", "tpot_ms"), ("e2e_ms", "E2E latency", "e2el_ms"))
"""(manifest target field, label, bench/plan key) for each latency the note reports."""
PERCENTILES = ("p50", "p95", "p99")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def _latency(figures: BenchEvidence | PlanPrediction | None, key: str) -> LatencyFigures:
    """One latency's figures (`ttft_ms`, `tpot_ms`, `e2el_ms`) from the bench or the plan's prediction."""
    found: LatencyFigures | None = getattr(figures, key) if figures is not None else None
    return found or LatencyFigures()


def _throughput(figures: BenchEvidence | PlanPrediction | None) -> Throughput:
    return (figures.throughput if figures is not None else None) or Throughput()


def workload_shape(served: ServedModel, evidence: Evidence) -> dict[str, Any]:
    """Item 4: context length, batch size and concurrency, request rate, response mode."""
    workload = served.capacity.workload
    source = "capacity.workload"
    if workload is None and evidence.bench is not None and evidence.bench.workload is not None:
        workload, source = evidence.bench.workload, "the bench's workload"
    if workload is None:
        raise missing(
            "workload shape",
            "declare capacity.workload in the manifest (input_tokens, output_tokens, arrival, rate_rps or "
            "concurrency, response_mode), or pass --bench from `gate bench MANIFEST --json bench.json`",
        )
    bat = served.batching
    return {
        "source": source,
        "context": {
            "max_model_len_tokens": served.runtime.max_model_len,
            "input_tokens": workload.input_tokens.model_dump(mode="json"),
            "output_tokens": workload.output_tokens.model_dump(mode="json"),
        },
        "batching": {
            "mode": bat.mode,
            "max_batch_size": bat.max_batch_size,
            "max_wait_ms": bat.max_wait_ms,
            "max_num_batched_tokens": bat.max_num_batched_tokens,
            "chunked_prefill": bat.chunked_prefill,
            "max_queue": served.failure_policy.max_queue,
        },
        "arrival": workload.arrival,
        "rate_rps": workload.rate_rps,
        "concurrency": workload.concurrency,
        "burstiness": workload.burstiness if workload.arrival == "gamma" else None,
        "response_mode": workload.response_mode,
    }


def _met(target: float | None, observed: float | None, higher_is_better: bool) -> bool | None:
    if target is None or observed is None:
        return None
    return observed >= target if higher_is_better else observed <= target


def _row(metric: str, unit: str, target: Any, predicted: Any, measured: Any, higher: bool = False) -> dict[str, Any]:
    target, predicted, measured = _number(target), _number(predicted), _number(measured)
    return {
        "metric": metric,
        "unit": unit,
        "target": target,
        "predicted": predicted,
        "measured": measured,
        "met": _met(target, measured if measured is not None else predicted, higher),
        "higher_is_better": higher,
    }


def capacity_rows(served: ServedModel, evidence: Evidence) -> list[dict[str, Any]]:
    """Latency percentiles, throughput, memory: target, predicted, measured."""
    targets = served.capacity.targets
    prediction = evidence.plan.predicted if evidence.plan is not None else None
    rows = []
    for field, label, key in LATENCIES:
        declared = getattr(targets, field) if targets else None
        predicted = _latency(prediction, key)
        measured = _latency(evidence.bench, key)
        for p in PERCENTILES:
            target = getattr(declared, p) if declared else None
            if target is None and predicted.percentile(p) is None and measured.percentile(p) is None:
                continue
            rows.append(_row(f"{label} {p}", "ms", target, predicted.percentile(p), measured.percentile(p)))
    floor = targets.throughput if targets else None
    measured_tp = _throughput(evidence.bench)
    predicted_tp = _throughput(prediction)
    for unit, key in (("requests/s", "requests_per_s"), ("tokens/s", "output_tokens_per_s")):
        target = floor.value if floor and floor.unit == unit else None
        if target is None and getattr(measured_tp, key) is None and getattr(predicted_tp, key) is None:
            continue
        label = "throughput" if unit == "requests/s" else "output throughput"
        rows.append(_row(label, unit, target, getattr(predicted_tp, key), getattr(measured_tp, key), higher=True))
    memory_target = targets.memory if targets else None
    predicted_mem = _plan_total_bytes(evidence.plan)
    measured_mem = evidence.bench.peak_memory_bytes if evidence.bench is not None else None
    if memory_target is not None or predicted_mem is not None or measured_mem is not None:
        rows.append(_row("memory", "bytes", memory_target, predicted_mem, measured_mem))
    return rows


def _plan_total_bytes(plan: PlanEvidence | None) -> float | None:
    """The plan's predicted memory: at the top of a memory-only plan, under `memory` in a full one."""
    if plan is None:
        return None
    if plan.total_bytes is not None:
        return plan.total_bytes
    return plan.memory.total_bytes if plan.memory is not None else None


def _cost(served: ServedModel, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Cost per hour as declared, and per 1k requests / 1M output tokens at the measured (else predicted) rate."""
    per_hour = served.capacity.cost_per_hour
    if per_hour is None:
        return None
    out: dict[str, Any] = {"currency": served.capacity.currency, "per_replica_hour": per_hour}
    for unit, name, scale in (("requests/s", "per_1k_requests", 1e3), ("tokens/s", "per_1m_output_tokens", 1e6)):
        row = next((r for r in rows if r["unit"] == unit), None)
        rate = row and (row["measured"] if row["measured"] is not None else row["predicted"])
        out[name] = per_hour / (rate * 3600) * scale if rate else None
    return out


_TARGET_WORDS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E"}


def _ms_words(ms: float) -> str:
    return f"{ms / 1000:.3g} s" if ms >= 1000 else f"{ms:.3g} ms"


def capacity_sentence(plan: PlanEvidence | None) -> str | None:
    """The plan in one plain sentence: what one replica holds under which target, with its interval, the replicas
    for the total rate, and which constraint binds (None without a plan's per-replica figures)."""
    per = plan.per_replica if plan is not None else None
    if plan is None or per is None or _number(per.rate_rps) is None:
        return None
    rate, low, high = float(per.rate_rps), _number(per.low_rps), _number(per.high_rps)
    name = per.binding_target
    target = next((t for t in plan.targets if t.name == name), None) if name else None
    if target is not None and _number(target.target) is not None:
        field, _, point = str(name).partition(".")
        under = f" with {point} {_TARGET_WORDS.get(field, field)} under {_ms_words(float(target.target or 0))}"
    else:
        under = ""
    if rate <= 0:
        text = f"no load meets the targets on one replica: {per.detail}".rstrip(": ")
        return text[0].upper() + text[1:] + "."
    holds = f"One replica holds {rate:.3g} requests/s of this workload{under}"
    if low is not None and high is not None and high > low:
        holds += f" ({100 * float(per.level):.0f}% interval {low:.3g}-{high:.3g})"
    replicas = plan.replicas
    if replicas is not None:
        holds += f"; {int(replicas.replicas)} replicas for {float(replicas.total_rps):.3g} requests/s"
    binding = {"latency": f"latency ({name})" if name else "latency", "memory": "memory (the KV pool)"}.get(
        str(per.binding), "throughput (the replica's capacity)"
    )
    return f"{holds}. The binding constraint is {binding}."


def _plan_summary(plan: PlanEvidence | None) -> dict[str, Any] | None:
    if plan is None:
        return None
    policy: dict[str, Any] | None = None
    if plan.recommended is not None:  # the policy's own fields, then its batching section's, scalars only
        rec = plan.recommended
        flat = {"kv_blocks": rec.kv_blocks, "max_model_len": rec.max_model_len, **rec.batching}
        policy = {k: v for k, v in flat.items() if isinstance(v, str | int | float | bool)}
    binding = plan.binding_constraint
    return {
        "weights_bytes": _number(plan.weights_bytes),
        "kv_bytes_per_token": _number(plan.kv_bytes_per_token),
        "max_concurrent_sequences": _number(plan.max_concurrent_sequences),
        "binding_constraint": ": ".join(v for v in (binding.name, binding.detail) if v) or None if binding else None,
        "bound": plan.regime,
        "sentence": capacity_sentence(plan),
        "policy": policy,
    }


def _bench_summary(bench: BenchEvidence | None) -> dict[str, Any] | None:
    if bench is None:
        return None
    requests, goodput = bench.requests or RequestCounts(), bench.goodput or Goodput()
    return {
        "requests_sent": _number(requests.sent),
        "requests_failed": _number(requests.failed),
        "goodput_requests_per_s": _number(goodput.requests_per_s),
        "goodput_fraction": _number(goodput.fraction),
        "runs": len(bench.runs),
    }


def supported_statements(bench: BenchEvidence | None) -> list[str]:
    """What the measured figures support, in words: p50 and p99 of each latency with its interval and floors,
    and what the bench found about its own run (failures, the workload's shape, a client that fell behind)."""
    from servegate.capacity.bench.percentiles import describe

    if bench is None:
        return []
    out: list[str] = []
    for _, label, key in LATENCIES:
        stats = _latency(bench, key)
        if stats.count:
            figures = stats.model_dump()
            out += [describe(label, figures, q) for q in (50, 99) if stats.percentile(f"p{q}") is not None]
    if bench.client_limited:
        out.append("the bench's client fell behind its schedule: latencies include the client's own delay")
    if bench.workload_shape is not None and not bench.workload_shape.achieved:
        out.append("the server's usage shows the workload's shape was not run as declared (see the bench warnings)")
    return out


def capacity_target(served: ServedModel, evidence: Evidence) -> dict[str, Any]:
    """Item 5: latency p50/p95/p99, throughput with its unit, memory and cost; predicted and measured side by side."""
    rows = capacity_rows(served, evidence)
    if not rows:
        raise missing(
            "capacity target",
            "run `gate bench MANIFEST --json bench.json` and pass --bench bench.json, or declare capacity.targets "
            "(or pass --plan from `gate plan MANIFEST --json plan.json`)",
        )
    return {
        "rows": rows,
        "sources": {
            "target": "capacity.targets" if served.capacity.targets else None,
            "predicted": evidence.sources.get("plan", "gate plan") if evidence.plan is not None else None,
            "measured": evidence.sources.get("bench", "gate bench") if evidence.bench is not None else None,
        },
        "cost": _cost(served, rows),
        "plan": _plan_summary(evidence.plan),
        "bench": _bench_summary(evidence.bench),
        "supported": supported_statements(evidence.bench),
    }
