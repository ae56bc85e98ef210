"""Evidence in the documented shapes of `gate check --json`, `gate bench --json` and `gate plan --json`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from servegate.contracts.manifest import ServedModel

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart" / "manifest.yaml"
FAKE_SHA = "ab" * 32


def quickstart_sets() -> list[str]:
    """--set options that give the quickstart weight checksums when the zoo has not recorded them yet."""
    from servegate.zoo.catalog import read_index

    try:
        files = read_index().get("tiny-primary", {}).get("files", {})
    except (OSError, ValueError):
        files = {}
    if any(name.endswith(".safetensors") for name in files):
        return []
    return [f"weights.sha256={{model.safetensors: {FAKE_SHA}}}"]


def score(
    baseline: float, candidate: float, n: int = 200, margin: float = 0.03, metric: str = "exact_match"
) -> dict[str, Any]:
    """One paired comparison as a quality gate reports it (servegate.contracts.report.quality.PairedTest)."""
    diff = candidate - baseline
    lower, upper = diff - 0.02, diff + 0.02
    return {
        "metric": metric,
        "n": n,
        "baseline_score": baseline,
        "candidate_score": candidate,
        "difference": diff,
        "lower": lower,
        "upper": upper,
        "confidence": 0.95,
        "margin": margin,
        "method": "exact",
        "regressions": None,
        "improvements": None,
        "n_min": None,
        "verdict": "pass" if lower > -margin else "fail",
        "reason": f"lower bound {lower:+.4f} against -{margin:g}",
    }


def gate(name: str, verdict: str, reason: str, measurements: dict[str, Any], evidence: Any = ()) -> dict[str, Any]:
    """One gate's result as `gate check --json` writes it."""
    return {
        "name": name,
        "verdict": verdict,
        "reason": reason,
        "measurements": measurements,
        "evidence": list(evidence),
        "triggered_by": ["every manifest"],
        "duration_s": 1.5,
    }


def check_report(
    gates: list[dict[str, Any]], fingerprint: str = "f" * 64, created_at: str = "2099-01-01T00:00:00+00:00"
) -> dict[str, Any]:
    """A check report around `gates`, its verdict and counts worked out as `gate check` does."""
    verdicts = [g["verdict"] for g in gates]
    verdict = "fail" if "fail" in verdicts else ("unavailable" if "unavailable" in verdicts else "pass")
    side = {"name": "quickstart", "version": "1", "fingerprint": fingerprint}
    return {
        "format_version": 1,
        "verdict": verdict,
        "fingerprint": fingerprint,
        "created_at": created_at,
        "mode": "reference",
        "baseline": {**side, "form": "reference"},
        "baseline_git": None,
        "candidate": {**side, "form": "manifest"},
        "counts": {v: verdicts.count(v) for v in ("pass", "fail", "warn", "skipped", "unavailable")},
        "duration_s": 4.5,
        "notes": [],
        "gates": gates,
    }


def next_token(agreement: float, kl: float) -> dict[str, Any]:
    """One suite's next-token divergence as the quality gates report it."""
    return {"items": 16, "positions": 160, "token_agreement": agreement, "mean_kl_nats": kl, "max_kl_nats": 4 * kl}


CACHING = {"caches": ["prefix cache"], "tenants_identified": True, "shared_across_tenants": [], "probes": 4,
           "cold_prefix_hits": 0, "warm_prefix_hits": 4, "tenant_b_extra_hits": 0, "output_mismatches": 0}  # fmt: skip
BATCHING = {"mode": "continuous", "max_batch_size": 8, "probes": 4, "arrangements": ["one at a time", "in order"],
            "outputs_compared": 8, "mismatches": 0, "mismatch_rate": 0.0, "expired_request": "deadline_exceeded",
            "finished_after_deadline": 0}  # fmt: skip


def make_report(served: ServedModel, created_at: str = "2099-01-01T00:00:00+00:00") -> dict[str, Any]:
    """A passing check report for `served` with a quantization gate on the quickstart's public suites."""
    quantization = {
        "method": "int8-weight",
        "simulated": False,
        "group_size": None,
        "dtype": "float32",
        "kv_cache_dtype": None,
        "calibration": {"suite": "zoo:arith", "split": "test", "items": 32},
        "suites": {
            "arith": {"items": 200, "exact_match": score(0.90, 0.89)},
            "recall": {"items": 200, "exact_match": score(0.95, 0.95)},
            "json": {
                "items": 200,
                "exact_match": score(0.80, 0.81),
                "json_schema_valid": score(1.0, 1.0, metric="json_schema_valid"),
            },
        },
        "next_token": {"arith": next_token(0.98, 0.012), "recall": next_token(0.99, 0.004)},
    }
    example = {"suite": "arith", "id": "arith-0003", "prompt": "12+30=", "reference": "42", "baseline": "42",
               "candidate": "43"}  # fmt: skip
    gates = [
        gate(
            "quantization",
            "pass",
            "int8-weight is non-inferior on 'arith', 'recall' and 'json'",
            quantization,
            [example],
        ),  # fmt: skip
        gate("caching", "pass", "no cross-tenant hits; warm and cold outputs identical", dict(CACHING)),
        gate("batching", "pass", "batch invariant", dict(BATCHING)),
    ]
    return check_report(gates, served.fingerprint, created_at)


def make_bench() -> dict[str, Any]:
    """A bench result with two runs of a rate sweep."""

    def stats(mean: float, p50: float, p95: float, p99: float) -> dict[str, float]:
        return {"mean": mean, "p50": p50, "p95": p95, "p99": p99, "count": 60}

    return {
        "target": "http://10.1.2.3:8000/v1",
        "workload": {"arrival": "poisson", "rate_rps": 5, "response_mode": "sync"},
        "ttft_ms": stats(20, 18, 40, 60),
        "tpot_ms": stats(5, 4, 8, 12),
        "itl_ms": stats(5, 4, 8, 12),
        "e2el_ms": stats(80, 70, 150, 300),
        "throughput": {"requests_per_s": 4.8, "output_tokens_per_s": 38.4},
        "goodput": {"requests_per_s": 4.7, "fraction": 0.98, "slo": {"e2el_ms": 5000}},
        "requests": {"sent": 60, "completed": 60, "failed": 0},
        "runs": [
            {"rate_rps": 2, "throughput": {"requests_per_s": 2.0}, "e2el_ms": {"p99": 120}},
            {"rate_rps": 5, "throughput": {"requests_per_s": 4.8}, "e2el_ms": {"p99": 300}},
        ],
    }


def make_plan() -> dict[str, Any]:
    """A capacity plan in the shape `gate plan --json` writes (servegate.capacity.planning.report.plan_json)."""
    return {
        "kv_bytes_per_token": 4096,
        "weights_bytes": 5_000_000,
        "max_concurrent_sequences": 128,
        "memory": {"weights_bytes": 5_000_000, "total_bytes": 80_000_000, "kv_pool_bytes": 67_108_864, "fits": True},
        "regime": "latency-bound",
        "predicted": {
            "ttft_ms": {"mean": 16, "p50": 15, "p95": 35, "p99": 50},
            "tpot_ms": {"mean": 4, "p50": 4, "p95": 6, "p99": 7},
            "itl_ms": {"mean": 4, "p50": 4, "p95": 6, "p99": 7},
            "e2el_ms": {"mean": 70, "p50": 60, "p95": 140, "p99": 250},
            "throughput": {"requests_per_s": 5.0, "output_tokens_per_s": 40.0},
        },
        "recommended": {"batching": {"mode": "continuous", "max_batch_size": 32}, "kv_blocks": 4096},
        "binding_constraint": {"name": "e2e_ms.p99", "detail": "latency at 5 requests/s"},
    }


def dump(path: Path, data: Any) -> Path:
    """Write JSON evidence to `path`."""
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def run_gate(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the `gate` CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "servegate.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )
