"""The manifest's `quality` section: the eval suites (servegate JSONL or lm-eval tasks), metrics and margins."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from servegate.contracts.section_base import Section

LM_EVAL_INSTALL = "pip install 'servegate[lm-eval]'"
"""The command that installs the optional lm-evaluation-harness extra (a tested lm-eval version)."""

_JSONL_ONLY = ("dataset", "split", "prompt_field", "reference_field", "max_tokens")
"""Suite fields that describe servegate's own JSONL suites; an lm-eval task's YAML says these itself."""

SuiteKind = Literal["text", "chat", "extraction", "tools"]
"""What a suite's items ask for: `text`, a completion of the prompt; `chat`, a plain chat answer to the prompt as the
user's message, scored on its text; `extraction`, a chat answer decoded under the item's JSON Schema
(response_format json_schema, strict), its `reference` the object expected; `tools`, a chat answer under the item's
`tools` and `tool_choice`, its `reference` the call expected ({"name", "arguments"})."""

KIND_METRICS: dict[str, list[str]] = {
    "text": ["exact_match"],
    "chat": ["contains_answer"],
    "extraction": ["json_schema_valid", "field_accuracy"],
    "tools": ["tool_name_match", "tool_arguments_match"],
}
"""The metrics a suite of each kind is scored by when it names none."""

TOOL_METRICS = ("tool_name_match", "tool_arguments_match")
"""Metrics that score the calls read out of an answer: they need a `tools` suite."""


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
    kind: SuiteKind = "text"
    """What each item asks for (see SuiteKind): `chat`, `extraction` and `tools` items are chat requests, so they
    need a chat template (and extraction postprocess.structured_output, tools postprocess.tools)."""
    split: str = "test"
    """Split to evaluate (zoo suites have `test` and `calibration`)."""
    metrics: list[str] = Field(default_factory=lambda: ["exact_match"], min_length=1)
    """Metrics computed on the suite (local evaluate modules: exact_match, json_schema_valid, field_accuracy,
    tool_name_match, tool_arguments_match, ...); left out, the kind's own (KIND_METRICS)."""
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
    def _kind_metrics(cls, data: Any) -> Any:
        if isinstance(data, dict) and "metrics" not in data and data.get("kind") in KIND_METRICS:
            return {**data, "metrics": KIND_METRICS[data["kind"]]}
        return data

    @model_validator(mode="after")
    def _metrics_fit_the_kind(self) -> Suite:
        misplaced = [m for m in self.metrics if m in TOOL_METRICS and self.kind != "tools"]
        if misplaced:
            raise ValueError(f"{', '.join(misplaced)} score tool calls: they need kind: tools (got {self.kind})")
        if self.lm_eval is not None and self.kind != "text":
            raise ValueError(f"an lm_eval suite is kind text: lm-eval builds its own requests (got {self.kind})")
        return self

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
    """How much faster (never-seen median / repeat median) an exact repeat, or the same prompt with another seed,
    may answer than a never-seen request of the same shape and prefix before a response cache is reported.
    MLPerf TEST04 allows 1.1 on a quiet machine; 1.5 stays clear of a shared machine's timing noise while real
    response caches answer 5-100x faster."""
    repeat_samples: int = Field(default=24, ge=8, le=10_000)
    """Rounds the response-cache detector times at most (each: a first send, the exact repeat, the same prompt
    with another seed, a never-seen prompt of the same shape)."""
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
