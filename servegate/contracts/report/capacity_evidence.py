"""The parts of `gate bench --json` and `gate plan --json` that the serving note reads, as pydantic models.

The bench's JSON is written by servegate.capacity.bench (load_generator.BenchResult.as_dict, run_metrics.summarize,
cli/bench.py adds `peak_memory_bytes` and `plots`); the plan's by servegate.capacity.planning.report.plan_json
(or cli/plan.py's memory-only plan). These models cover only the fields `gate note` uses: every model here
sets `extra="ignore"`, so the rest of each file (definitions, warnings, the latency model, candidates, ...) is
read past, not checked. A field the writer may leave out or set to null is optional here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from servegate.contracts.capacity_section import Workload
from servegate.contracts.report.base import JsonObject


class _Part(BaseModel):
    """A part of another command's JSON: the fields the note reads; the others are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class LatencyFigures(_Part):
    """One latency's summary in milliseconds (run_metrics.latency_summary), with each percentile's interval,
    conservative estimate and floor when the bench computed them (percentiles.PercentileEstimate.fields)."""

    mean: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    count: int = 0
    """Requests the figures are over."""
    p50_ci: list[float] | None = None
    p50_conservative: float | None = None
    p50_floor: int | None = None
    p95_ci: list[float] | None = None
    p95_conservative: float | None = None
    p95_floor: int | None = None
    p99_ci: list[float] | None = None
    p99_conservative: float | None = None
    p99_floor: int | None = None

    def percentile(self, name: str) -> float | None:
        """`p50`, `p95` or `p99` by name."""
        value: float | None = getattr(self, name)
        return value


class Throughput(_Part):
    """Completed requests and output tokens per second."""

    requests_per_s: float | None = None
    output_tokens_per_s: float | None = None


class Goodput(_Part):
    """Requests per second within the SLO, and the fraction (0 to 1) within it."""

    requests_per_s: float | None = None
    fraction: float | None = None


class RequestCounts(_Part):
    """Requests sent and failed."""

    sent: int | None = None
    failed: int | None = None


class WorkloadShapeCheck(_Part):
    """Whether the server's usage shows the declared workload shape was run (checks.workload_shape)."""

    achieved: bool = True


class BenchRunFigures(_Part):
    """One run of a bench (a sweep has one per load): its offered load, throughput and E2E latency."""

    rate_rps: float | None = None
    concurrency: float | None = None
    throughput: Throughput | None = None
    e2el_ms: LatencyFigures | None = None


class BenchEvidence(_Part):
    """`gate bench --json`: pooled latencies, throughput, goodput, requests, runs and the bench's own checks."""

    workload: Workload | None = None
    """The workload the bench ran (the manifest's capacity.workload with the command line's overrides)."""
    ttft_ms: LatencyFigures | None = None
    tpot_ms: LatencyFigures | None = None
    e2el_ms: LatencyFigures | None = None
    throughput: Throughput | None = None
    goodput: Goodput | None = None
    requests: RequestCounts | None = None
    runs: list[BenchRunFigures] = []
    peak_memory_bytes: int | None = None
    """Peak resident memory of the local server process (bytes), when the bench started it."""
    client_limited: bool = False
    """The bench's client fell behind its schedule."""
    workload_shape: WorkloadShapeCheck | None = None
    plots: list[str] = []
    """PNG paths `gate bench --plots DIR` wrote, as given on its command line."""


class PlanMemory(_Part):
    """The plan's memory figures (capacity.memory.plan.MemoryPlan.as_dict)."""

    total_bytes: float | None = None


class PlanPrediction(_Part):
    """The simulator's prediction for the recommended policy."""

    ttft_ms: LatencyFigures | None = None
    tpot_ms: LatencyFigures | None = None
    e2el_ms: LatencyFigures | None = None
    throughput: Throughput | None = None


class RecommendedPolicy(_Part):
    """The policy the plan recommends."""

    batching: JsonObject = {}
    """The manifest's batching section for that policy, as its schema dumps it."""
    kv_blocks: int | None = None
    max_model_len: int | None = None


class BindingConstraint(_Part):
    """The constraint closest to limiting the recommended policy."""

    name: str | None = None
    detail: str | None = None


class PerReplica(_Part):
    """What one replica carries under the targets (capacity.planning.rate_limit.RateLimit)."""

    rate_rps: float
    low_rps: float | None = None
    high_rps: float | None = None
    level: float = 0.8
    binding: str | None = None
    """`latency`, `throughput` or `memory`."""
    binding_target: str | None = None
    """The latency target that binds (e.g. `e2e_ms.p99`)."""
    detail: str = ""


class TargetCheck(_Part):
    """One declared target checked against the prediction."""

    name: str
    target: float | None = None


class ReplicaCount(_Part):
    """Replicas for the total rate."""

    replicas: int
    total_rps: float


class PlanEvidence(_Part):
    """`gate plan --json` (or its memory-only form): memory, regime, prediction, policy and per-replica figures."""

    kv_bytes_per_token: float | None = None
    weights_bytes: float | None = None
    max_concurrent_sequences: float | None = None
    total_bytes: float | None = None
    """Memory-only plans carry their total at the top; full plans under `memory`."""
    memory: PlanMemory | None = None
    regime: str | None = None
    predicted: PlanPrediction | None = None
    recommended: RecommendedPolicy | None = None
    binding_constraint: BindingConstraint | None = None
    per_replica: PerReplica | None = None
    targets: list[TargetCheck] = []
    replicas: ReplicaCount | None = None
