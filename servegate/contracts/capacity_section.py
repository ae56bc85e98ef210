"""The manifest's `capacity` section: the declared workload, the latency, throughput and memory targets."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from servegate.contracts.section_base import Section
from servegate.contracts.units import ByteSize


class LengthDistribution(Section):
    """A distribution of token counts (prompt or output length)."""

    distribution: Literal["fixed", "uniform", "lognormal"] = "fixed"
    """Shape: `fixed` (always mean), `uniform` on [min, max], `lognormal` around mean clipped to [min, max]."""
    mean: int = Field(default=128, ge=1, le=1_048_576)
    """Mean length in tokens."""
    min: int = Field(default=1, ge=1, le=1_048_576)
    """Shortest length in tokens."""
    max: int = Field(default=1024, ge=1, le=1_048_576)
    """Longest length in tokens."""

    @model_validator(mode="after")
    def _ordered(self) -> LengthDistribution:
        if not self.min <= self.mean <= self.max:
            raise ValueError(f"need min <= mean <= max (got {self.min}, {self.mean}, {self.max})")
        return self


class Workload(Section):
    """The request shape and arrival process the deployment is sized for."""

    input_tokens: LengthDistribution = Field(default_factory=lambda: LengthDistribution(mean=128, max=512))
    """Prompt length distribution."""
    output_tokens: LengthDistribution = Field(default_factory=lambda: LengthDistribution(mean=64, max=256))
    """Output length distribution."""
    arrival: Literal["poisson", "gamma", "constant", "closed"] = "poisson"
    """Open-loop `poisson`, `gamma` or evenly spaced `constant` arrivals at rate_rps, or `closed` loop at fixed
    concurrency."""
    rate_rps: float | None = Field(default=None, gt=0, le=1_000_000)
    """Mean arrival rate in requests/s (open loop)."""
    concurrency: int | None = Field(default=None, ge=1, le=1_000_000)
    """Requests in flight at once (closed loop)."""
    burstiness: float = Field(default=1.0, gt=0, le=100)
    """Gamma shape parameter: 1 is Poisson, below 1 burstier, above 1 smoother."""
    response_mode: Literal["sync", "streaming", "async", "batch"] = "sync"
    """How clients receive results."""
    num_requests: int = Field(default=200, ge=1, le=10_000_000)
    """Requests sent by one bench run."""

    @model_validator(mode="after")
    def _rate_or_concurrency(self) -> Workload:
        if self.arrival == "closed" and self.concurrency is None:
            raise ValueError("arrival: closed needs concurrency (requests in flight)")
        if self.arrival in ("poisson", "gamma", "constant") and self.rate_rps is None:
            raise ValueError(f"arrival: {self.arrival} needs rate_rps (requests/s)")
        return self


class Percentiles(Section):
    """Latency budget in milliseconds at each percentile (any may be omitted)."""

    p50: float | None = Field(default=None, gt=0)
    """Median latency budget, ms."""
    p95: float | None = Field(default=None, gt=0)
    """95th percentile budget, ms."""
    p99: float | None = Field(default=None, gt=0)
    """99th percentile budget, ms."""


class Throughput(Section):
    """A throughput floor with its unit."""

    value: float = Field(gt=0)
    """Lowest acceptable throughput."""
    unit: Literal["requests/s", "tokens/s"] = "requests/s"
    """Unit of `value` (tokens/s counts output tokens)."""


class Targets(Section):
    """Service-level targets that the plan must meet and the bench checks."""

    ttft_ms: Percentiles | None = None
    """Time to first token, ms."""
    tpot_ms: Percentiles | None = None
    """Time per output token after the first, ms."""
    e2e_ms: Percentiles | None = None
    """End-to-end request latency, ms."""
    throughput: Throughput | None = None
    """Throughput floor."""
    memory: ByteSize | None = None
    """Memory budget for weights, runtime and KV cache together ("16GiB"): the whole server process at its peak
    as the capacity gate measures it (resident memory), or as planned for an endpoint it cannot measure."""


class Capacity(Section):
    """The workload the deployment is sized for and the targets it must meet."""

    workload: Workload | None = None
    """Request shape and arrivals."""
    targets: Targets | None = None
    """Latency, throughput and memory targets."""
    tolerance: float = Field(default=0.10, ge=0, le=10)
    """How much worse than its baseline a change may make each target metric before the capacity gate fails it
    (0.10: 10%), judged on the 95% interval of the candidate/baseline ratio from an interleaved bench."""
    runtime_overhead: ByteSize | None = None
    """Declared runtime memory overhead beyond weights and KV cache (`null`: measured by profiling)."""
    total_rate_rps: float | None = Field(default=None, gt=0, le=1_000_000_000)
    """Requests/s the whole deployment must carry at its peak, all replicas together: `gate plan` recommends
    ceil(total_rate_rps / the requests/s one replica carries under the targets) replicas (`null`: one replica)."""
    cost_per_hour: float | None = Field(default=None, ge=0)
    """Cost of one replica per hour, in the currency of `currency`, for cost figures in the note."""
    currency: str = "USD"
    """Currency of cost_per_hour."""
