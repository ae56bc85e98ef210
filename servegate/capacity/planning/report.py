"""What `gate plan` prints and writes: the plan as JSON, as a table, and back into the manifest.

`write_plan` edits only what the plan decides (the `batching` section, `runtime.max_model_len`, and the
KV pool's `memory_budget`) through ruamel.yaml's round trip, so every comment, key order and quoting
elsewhere in the file stays as the author wrote it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.planning.planner import Candidate, Plan
from servegate.contracts.errors import ManifestError
from servegate.contracts.files import write_atomic
from servegate.contracts.units import format_bytes

PERCENTILE_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def _section(parent: CommentedMap, key: str) -> CommentedMap:
    """parent[key] as a mapping, created when absent."""
    section = parent.get(key)
    if not isinstance(section, CommentedMap):
        section = CommentedMap()
        parent[key] = section
    return section


def plan_json(plan: Plan, model: LatencyModel, workload: dict[str, Any], fingerprint: str) -> dict[str, Any]:
    """The plan as JSON: memory, regime, recommended policy, predicted figures, targets, binding constraint."""
    best = plan.recommended
    s = best.prediction.summary
    mem = plan.memory.as_dict()
    return {
        "fingerprint": fingerprint,
        "kv_bytes_per_token": plan.memory.kv_bytes_per_token,
        "weights_bytes": plan.memory.weights_bytes,
        "max_concurrent_sequences": plan.memory.max_concurrent_sequences,
        "memory": mem,
        "workload": workload,
        "regime": plan.regime,
        "regime_reason": plan.regime_reason,
        "single_request_ms": plan.single_request_ms,
        "feasible": plan.feasible,
        "recommended": {
            "batching": best.served.batching.model_dump(mode="json"),
            "kv_cache": best.served.runtime.kv_cache.model_dump(mode="json") if best.served.runtime.kv_cache else None,
            "kv_blocks": best.num_blocks,
            "max_model_len": best.served.runtime.max_model_len,
        },
        "predicted": {
            **{k: s[k] for k in PERCENTILE_KEYS},
            "throughput": s["throughput"],
            "capacity_requests_per_s": best.capacity_rps,
            "queue_length": s["queue_length"],
            "kv_blocks_used": s["kv_blocks_used"],
            "running": s["running"],
            "preemptions": s["preemptions"],
        },
        "targets": [c.as_dict() for c in best.checks],
        "binding_constraint": plan.binding,
        "why": plan.why,
        "notes": plan.notes,
        "latency_model": {
            "coefficients_s": model.steps.as_dict(),
            "overheads_s": model.overheads.as_dict(),
            "jitter": model.jitter.as_dict(),
            "hardware": dict(model.provenance.hardware),
            "fit": model.fit.as_dict(samples=False),
        },
        "per_replica": plan.rate_limit.as_dict() if plan.rate_limit else None,
        "knee": knee_json(model, plan.rate_limit.rate_rps if plan.rate_limit else None),
        "replicas": plan.replicas.as_dict() if plan.replicas else None,
        "candidates": candidate_rows(plan),
    }


def knee_json(model: LatencyModel, claimed: float | None) -> dict[str, Any] | None:
    """The knee the profile's rate search measured (an engine profiled from outside), and whether the claimed
    per-replica rate lies in its bracket or is an extrapolation; None without a knee search."""
    box = model.fit.black_box
    if box is None or box.knee is None:
        return None
    knee = box.knee
    return {
        "kept_up_rps": knee.measured_knee_rps,
        "missed_rps": knee.missed_rps,
        "measured_range_rps": list(knee.measured_range),
        "runs": len(knee.rates),
        "claimed_rps": claimed,
        "extrapolated": claimed is not None and knee.extrapolated(claimed),
        "position": knee.position(claimed) if claimed is not None else "not claimed",
        "measured_capacity_rps": knee.measured_capacity_rps,
    }


def _knee_line(k: dict[str, Any]) -> str:
    """The claimed rate against the measured knee, in one line."""
    lo, hi = k["measured_range_rps"]
    claimed = k["claimed_rps"] or 0.0
    if k["kept_up_rps"] is not None and k["missed_rps"] is not None:
        where = f"knee measured between {k['kept_up_rps']:.3g} and {k['missed_rps']:.3g} requests/s"
    else:
        where = f"knee not measured (the profile's {k['runs']} runs from {lo:.3g} to {hi:.3g} requests/s)"
    return f"per replica vs the profile: {where}, at the limits the engine ran with; {claimed:.3g} is {k['position']}"


def _verdict(c: Candidate, best: Candidate, plan: Plan) -> str:
    """Why a candidate was or was not recommended, in a few words."""
    if c is best:
        return "recommended"
    if not c.feasible:
        worst = max(c.checks, key=lambda ch: ch.ratio)
        return f"misses {worst.name} by {100 * (worst.ratio - 1):.0f}%"
    if best.max_rate_rps is not None and c.max_rate_rps is not None and c.max_rate_rps < best.max_rate_rps:
        return f"carries {c.max_rate_rps:.3g} requests/s under the targets, fewer than {best.max_rate_rps:.3g}"
    if plan.regime == "throughput-bound" and (c.capacity_rps or 0) < (best.capacity_rps or 0):
        return f"sustains {c.capacity_rps or 0:.3g} requests/s, fewer than {best.capacity_rps or 0:.3g}"
    return "feasible, predicted slower than the recommended (or equal and larger)"


def candidate_rows(plan: Plan) -> list[dict[str, Any]]:
    """Every candidate policy the search tried, the recommended first: its batching, predictions and verdict."""
    best = plan.recommended
    rows = []
    for c in plan.candidates:
        s = c.prediction.summary
        rows.append(
            {
                "batching": c.batching,
                "feasible": c.feasible,
                "worst_target_ratio": c.worst_ratio,
                "ttft_ms_p99": s["ttft_ms"]["p99"],
                "e2el_ms_p50": s["e2el_ms"]["p50"],
                "e2el_ms_p99": s["e2el_ms"]["p99"],
                "capacity_requests_per_s": c.capacity_rps,
                "max_rate_under_targets_rps": c.max_rate_rps,
                "verdict": _verdict(c, best, plan),
            }
        )
    return rows


def policy_text(batching: dict[str, Any]) -> str:
    """A batching section in one short cell: `continuous b=8 tok=512 chunked`."""
    short = {"max_batch_size": "b", "max_wait_ms": "wait", "max_num_batched_tokens": "tok"}
    parts = [str(batching.get("mode", "?"))]
    parts += [
        f"{short[k]}={batching[k]:g}" for k in short if k in batching and not (k == "max_wait_ms" and not batching[k])
    ]
    return " ".join(parts + (["chunked"] if batching.get("chunked_prefill") else []))


def plan_lines(data: dict[str, Any]) -> list[str]:
    """The plan for a terminal, one fact per line, every number with its unit."""
    b = data["recommended"]["batching"]
    policy = ", ".join(f"{k}={v}" for k, v in b.items())
    p = data["predicted"]
    lines = [
        f"regime: {data['regime']} ({data['regime_reason']})",
        f"recommended batching: {policy}",
        f"feasible: {'yes' if data['feasible'] else 'NO'}",
        f"binding constraint: {data['binding_constraint']['name']} - {data['binding_constraint']['detail']}",
    ]
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2EL")):
        v = p[key]
        lines.append(f"predicted {label}: p50 {v['p50']:.1f} ms, p95 {v['p95']:.1f} ms, p99 {v['p99']:.1f} ms")
    lines.append(
        f"predicted throughput: {p['throughput']['requests_per_s']:.2f} requests/s, "
        f"{p['throughput']['output_tokens_per_s']:.1f} output tokens/s; sustains up to "
        f"{(p['capacity_requests_per_s'] or 0):.2f} requests/s"
    )
    for t in data["targets"]:

        def show(x: float, unit: str = t["unit"]) -> str:
            return format_bytes(x) if unit == "bytes" else f"{x:.4g} {unit}"

        lines.append(
            f"target {t['name']}: predicted {show(t['predicted'])} vs {show(t['target'])} - "
            + ("met" if t["met"] else f"MISSED by {show(t['missed_by'])} ({t['missed_by_pct']:.1f}%)")
        )
    mem = data["memory"]
    if not mem.get("modelled", True) and mem.get("budget_bytes") is not None:
        lines.append(f"target memory: not modelled - {mem['not_modelled_reason']}; no verdict from a partial sum")
    if (r := data.get("per_replica")) is not None:
        spread = f"{100 * r['measured_spread']:.1f}% measured on {r['spread_from']}" if r["spread_from"] else "none"
        lines.append(
            f"per replica: {r['rate_rps']:.3g} requests/s under the targets ({100 * r['level']:.0f}% interval "
            f"{r['low_rps']:.3g}-{r['high_rps']:.3g}: jitter seeds, measured spread {spread}); binds: "
            f"{r['binding']} - {r['detail']}"
        )
    if (k := data.get("knee")) is not None:
        lines.append(_knee_line(k))
    if (n := data.get("replicas")) is not None:
        lines.append(
            f"replicas: {n['replicas']} for {n['total_rps']:.4g} requests/s ({n['source']}) at "
            f"{n['per_replica_rps']:.3g} requests/s each"
        )
    lines += [f"why: {w}" for w in data["why"]]
    lines += [f"note: {n}" for n in data["notes"]]
    return lines


def write_batching(path: Path, batching: dict[str, Any]) -> None:
    """Set the manifest file's `batching` keys to `batching`, keeping comments and everything else (atomic)."""
    write_plan(path, batching)


def write_plan(
    path: Path, batching: dict[str, Any], max_model_len: int | None = None, kv_memory_budget: int | None = None
) -> None:
    """Write a plan into the manifest file: the `batching` section, and when given `runtime.max_model_len` and
    `runtime.kv_cache.memory_budget`; comments, key order and everything else stay as written (atomic)."""
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    text = path.read_text(encoding="utf-8")
    data = yaml.load(io.StringIO(text))
    if not isinstance(data, CommentedMap):
        raise ManifestError([f"{path}: the manifest must be a mapping of sections"])
    section = _section(data, "batching")
    for key in [k for k in section if k not in batching]:
        del section[key]  # a key the new policy does not set would otherwise keep its old value
    for key, value in batching.items():
        section[key] = value
    if max_model_len is not None:
        _section(data, "runtime")["max_model_len"] = max_model_len
    if kv_memory_budget is not None:
        _section(_section(data, "runtime"), "kv_cache")["memory_budget"] = kv_memory_budget
    out = io.StringIO()
    yaml.dump(data, out)
    write_atomic(path, out.getvalue())
