"""The manifest sections that say how a served model is judged: quality, capacity and its public card."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from servegate.contracts.sections import Section
from servegate.contracts.units import ByteSize

# --- quality ---------------------------------------------------------------------------------------

LM_EVAL_INSTALL = "pip install 'servegate[lm-eval]'"
"""The command that installs the optional lm-evaluation-harness extra (a tested lm-eval version)."""

_JSONL_ONLY = ("dataset", "split", "prompt_field", "reference_field", "max_tokens")
"""Suite fields that describe servegate's own JSONL suites; an lm-eval task's YAML says these itself."""


def lm_eval_installed() -> bool:
    """Whether lm-evaluation-harness can be imported (without importing it: that takes seconds)."""
    if "lm_eval" in sys.modules:
        return sys.modules["lm_eval"] is not None
    try:
        return importlib.util.find_spec("lm_eval") is not None
    except (ImportError, ValueError):
        return False


class LmEvalTask(Section):
    """An lm-evaluation-harness task run as a suite: lm-eval builds the prompts and scores each sample."""

    task: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """lm-eval task name (`gsm8k`, `mmlu_abstract_algebra`, or one defined by a YAML under include_path)."""
    num_fewshot: int | None = Field(default=None, ge=0, le=64)
    """Few-shot examples put before each prompt (`null`: the task's own default)."""
    limit: int | None = Field(default=None, ge=1)
    """Evaluate only the first N documents of the task (`null`: all)."""
    include_path: str | None = Field(default=None, min_length=1)
    """Folder of task YAMLs lm-eval reads besides its own (relative to the manifest), or `zoo` for the
    tasks servegate ships over the zoo's suites (zoo_arith, zoo_arith_choice)."""
    fewshot_seed: int = Field(default=1234, ge=0)
    """Seed lm-eval draws few-shot examples with (the same on both sides of a comparison)."""


class Suite(Section):
    """An evaluation suite: items with a prompt and a reference, scored by one or more metrics."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """Name used in reports."""
    dataset: str = Field(min_length=1)
    """`zoo:NAME` (a suite shipped with servegate), a local JSONL/CSV/parquet file, or `hf:ORG/NAME`; for an
    lm-eval suite leave it out (it reads `lm-eval:TASK`)."""
    lm_eval: LmEvalTask | None = None
    """Run an lm-evaluation-harness task instead of a JSONL suite (needs `pip install 'servegate[lm-eval]'`);
    `metrics` then names the task's metrics to gate on (left out: all the task reports per sample)."""
    split: str = "test"
    """Split to evaluate (zoo suites have `test` and `calibration`)."""
    metrics: list[str] = Field(default_factory=lambda: ["exact_match"], min_length=1)
    """Metrics computed on the suite (local evaluate modules: exact_match, json_schema_valid, ...)."""
    public: bool = False
    """Whether items may appear in public reports and notes; private suites only show ids and lengths."""
    limit: int | None = Field(default=None, ge=1)
    """Evaluate only the first N items (`null`: all)."""
    max_tokens: int = Field(default=16, ge=1, le=65_536)
    """Tokens generated per item."""
    prompt_field: str = "prompt"
    """Column holding the prompt."""
    reference_field: str = "reference"
    """Column holding the expected output."""

    @model_validator(mode="before")
    @classmethod
    def _lm_eval_or_dataset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("lm_eval") is None:
            if isinstance(data, dict) and "dataset" not in data:
                raise ValueError("a suite needs `dataset` (a JSONL suite) or `lm_eval` (an lm-eval task)")
            return data
        task = data["lm_eval"]
        # a dumped suite (isolated(), the cache) carries the defaults and the derived dataset: those are fine
        defaults = {f: cls.model_fields[f].get_default(call_default_factory=True) for f in _JSONL_ONLY}
        defaults["dataset"] = _lm_eval_dataset(task)
        given = [f for f in _JSONL_ONLY if f in data and data[f] != defaults[f]]
        if given:
            raise ValueError(
                f"an lm_eval suite takes prompts, targets and generation lengths from its task: remove "
                f"{', '.join(given)} (or drop lm_eval to run a JSONL suite)"
            )
        limit = task.get("limit") if isinstance(task, dict) else getattr(task, "limit", None)
        if data.get("limit") is not None and limit is not None:
            raise ValueError("give the limit once: either limit or lm_eval.limit")
        if not lm_eval_installed():
            raise ValueError(
                f"suite {data.get('name')!r} is an lm-eval task, and lm-eval is not installed: run {LM_EVAL_INSTALL}"
            )
        return {**data, "dataset": _lm_eval_dataset(task)}

    @property
    def item_limit(self) -> int | None:
        """Items evaluated: `limit`, or `lm_eval.limit` for an lm-eval suite."""
        return self.lm_eval.limit if self.lm_eval is not None and self.lm_eval.limit is not None else self.limit


def _lm_eval_dataset(task: Any) -> str:
    """What `dataset` reads for an lm-eval suite: `lm-eval:TASK`."""
    name = task.get("task") if isinstance(task, dict) else getattr(task, "task", None)
    return f"lm-eval:{name}"


class LengthBand(Section):
    """How far the candidate's mean generated tokens per item (by suite) may move from the baseline's."""

    low: float = Field(default=0.9, gt=0, le=1)
    """Lowest candidate/baseline ratio of mean generated tokens per item (MLPerf asks for at least 0.9)."""
    high: float = Field(default=1.1, ge=1, le=100)
    """Highest candidate/baseline ratio of mean generated tokens per item."""


class CacheAudit(Section):
    """The caching gate's black-box timing audits, measured over HTTP (the same on any backend or endpoint)."""

    enabled: bool = True
    """Run the response-cache detector and the tenant isolation audit (false: counters and scope checks only)."""
    max_repeat_speedup: float = Field(default=1.5, gt=1, le=100)
    """How much faster (fresh median / repeat median) an exact repeat may answer than a never-seen request of
    the same shape and prefix before an undeclared response cache is reported. MLPerf TEST04 allows 1.1 on a
    quiet machine; 1.5 stays clear of a shared machine's timing noise while real response caches answer 5-100x
    faster."""
    repeat_samples: int = Field(default=24, ge=8, le=10_000)
    """Repeat/fresh pairs the response-cache detector times."""
    tenant_samples: int = Field(default=40, ge=8, le=10_000)
    """Requests per side (fresh, cross-tenant, same-tenant repeat) of the tenant audit: 40 detects a shift of
    0.87 standard deviations at alpha 0.01 with power 0.9 (docs/cache-audits.md); the paper used 250."""
    alpha: float = Field(default=0.01, gt=0, lt=0.5)
    """Significance level of the one-sided Mann-Whitney tests; a cache is reported only below it."""


class Quality(Section):
    """Eval suites and the non-inferiority margins every optimization is gated against."""

    suites: list[Suite] = Field(default_factory=list)
    """Suites the quality gates run."""
    margins: dict[str, float] = Field(default_factory=dict)
    """Non-inferiority margin per metric, as an absolute score difference (0.02 = two points)."""
    default_margin: float = Field(default=0.02, ge=0, le=1)
    """Margin for metrics not listed in `margins`."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    """Confidence level of the one-sided non-inferiority test."""
    max_failure_examples: int = Field(default=5, ge=0, le=100)
    """Most failure examples (baseline vs candidate output) kept per gate; public suites only."""
    max_unavailable_share: float = Field(default=0.0, ge=0, lt=1)
    """Largest share of a suite's requests that may end `model_unavailable` (a remote that cannot be reached or
    answers 5xx) before the run is reported unavailable (exit 2) instead of scored."""
    length_band: LengthBand = Field(default_factory=LengthBand)
    """Band for the candidate's mean generated tokens per item relative to the baseline's, by suite: outside it a
    quality comparison fails even when its metrics hold (an answer that got shorter can keep exact match)."""
    cache_audit: CacheAudit = Field(default_factory=CacheAudit)
    """Timing audits of the caching gate: an undeclared response cache, and a prefix cache shared across tenants."""

    @field_validator("margins")
    @classmethod
    def _margins_are_fractions(cls, value: dict[str, float]) -> dict[str, float]:
        for metric, margin in value.items():
            if not 0.0 <= margin <= 1.0:
                raise ValueError(f"margin for {metric!r} is a score difference between 0 and 1 (got {margin})")
        return value

    @model_validator(mode="after")
    def _unique_suite_names(self) -> Quality:
        names = [s.name for s in self.suites]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"suite names must be unique: {', '.join(dupes)} appear more than once")
        return self


# --- capacity --------------------------------------------------------------------------------------


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
    cost_per_hour: float | None = Field(default=None, ge=0)
    """Cost of one replica per hour, in the currency of `currency`, for cost figures in the note."""
    currency: str = "USD"
    """Currency of cost_per_hour."""


# --- card ------------------------------------------------------------------------------------------


class Card(Section):
    """Public identity of the served model for the serving note (never fingerprinted)."""

    public_name: str | None = None
    """Name the model is published under."""
    model_class: str | None = None
    """Generic model class when the name is not public (e.g. "1M-parameter Llama-architecture LM")."""
    intended_use: str | None = None
    """What the served model is for."""
    observability: str = (
        "Aggregate metrics only (request counts by status, latency histograms, token counts, queue depth, "
        "cache hits); raw request and response text is never logged."
    )
    """Statement of what is observed in production; raw input is never logged."""
    license: str | None = None
    """Licence of the weights."""
