"""The quality records of the check report: paired tests, output length, suites, boundaries, next-token divergence."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from servegate.contracts.report.base import JsonObject, ReportRecord, Verdict, unmeasured


class PairedTest(ReportRecord):
    """A paired non-inferiority test of one metric on one suite (scores are fractions 0 to 1)."""

    metric: str
    """The metric tested."""
    n: int
    """Items compared (the same items on both sides)."""
    baseline_score: float
    """The baseline's mean score."""
    candidate_score: float
    """The candidate's mean score."""
    difference: float
    """candidate_score - baseline_score."""
    lower: float
    """One-sided lower confidence bound of the difference at `confidence` (the decision statistic)."""
    upper: float
    """One-sided upper confidence bound of the difference at `confidence`."""
    confidence: float
    """The confidence level (fraction, 0 to 1)."""
    margin: float
    """The non-inferiority margin: the largest drop allowed (fraction)."""
    method: str
    """How the bound was computed (exact, bootstrap, ...)."""
    regressions: int | None
    """Items right for the baseline and wrong for the candidate (0/1 metrics only)."""
    improvements: int | None
    """Items wrong for the baseline and right for the candidate (0/1 metrics only)."""
    n_min: int | None
    """Smallest n at which a candidate identical to the baseline could show non-inferiority at this margin."""
    verdict: Literal["pass", "fail", "warn"]
    """The test's verdict."""
    reason: str
    """One line naming the figures."""

    @field_validator("baseline_score", "candidate_score", "difference", "lower", "upper")
    @classmethod
    def _rounded(cls, value: float) -> float:
        return round(value, 6)  # the report keeps six decimals: more is noise at any suite size


class OutputLength(ReportRecord):
    """The output-length guard of one suite: mean generated length per item of both sides, against the band."""

    suite: str
    """The suite compared."""
    items: int
    """Items both sides answered without an error (the ones averaged)."""
    unit: str
    """`tokens`, or `characters` for a remote candidate (or a side without token ids)."""
    baseline_mean_tokens: float
    """The baseline's mean generated length per item (in `unit`)."""
    candidate_mean_tokens: float
    """The candidate's mean generated length per item (in `unit`)."""
    ratio: float | None
    """candidate / baseline mean (None when the baseline generated nothing: nothing to compare)."""
    band_low: float
    """quality.length_band's lower end (ratio)."""
    band_high: float
    """quality.length_band's upper end (ratio)."""
    verdict: Verdict
    """pass inside the band."""


class SuiteScores(ReportRecord):
    """One suite in a paired comparison: its size, where the baseline came from, and each metric's test.

    In the JSON each metric's test sits beside the suite's other keys, under the metric's name.
    """

    items: int | None = unmeasured()
    """Items in the suite (items)."""
    baseline_from_cache: bool | None = unmeasured()
    """Whether the baseline's outputs were read from the output cache instead of generated."""
    candidate_errors: int | None = unmeasured()
    """Items the candidate answered with an error (items)."""
    lm_eval_aggregate: JsonObject | None = unmeasured()
    """lm-eval's own aggregate of each side ({"baseline": ..., "candidate": ...}), for lm-eval suites."""
    metrics: dict[str, PairedTest] = {}
    """Metric name -> its paired non-inferiority test; one report key each."""
    output_length: OutputLength | None = unmeasured()
    """The output-length guard: mean generated length per item of both sides against quality.length_band."""

    @model_validator(mode="before")
    @classmethod
    def _gather_metrics(cls, data: Any) -> Any:
        if isinstance(data, dict) and "metrics" not in data:
            own = set(cls.model_fields)
            data = {
                **{k: v for k, v in data.items() if k in own},
                "metrics": {k: v for k, v in data.items() if k not in own},
            }
        return data

    @model_serializer(mode="wrap")
    def _flatten_metrics(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key == "metrics":
                out.update(value)
            elif not (value is None and key != "metrics"):  # every other key is unmeasured() when None
                out[key] = value
        return out


class BoundaryCheck(ReportRecord):
    """Whether one model's score stays at or above a declared boundary (a fallback's floor)."""

    metric: str
    """The metric checked."""
    n: int
    """Items scored."""
    score: float
    """The mean score (fraction, 0 to 1)."""
    lower: float
    """One-sided lower confidence bound of the score."""
    boundary: float
    """The declared floor (fraction, 0 to 1)."""
    confidence: float
    """The confidence level (fraction, 0 to 1)."""
    verdict: Literal["pass", "fail", "warn"]
    """pass when the lower bound is at or above the boundary, fail when the score itself is below, else warn."""
    reason: str
    """One line naming the figures."""


class NextTokenSuite(ReportRecord):
    """How the two sides' next-token distributions differ on a sample of one suite's items."""

    items: int
    """Items sampled (items)."""
    positions: int
    """Token positions compared (positions)."""
    token_agreement: float
    """Share of positions where both sides' most likely next token is the same (fraction, 0 to 1)."""
    mean_kl_nats: float
    """Mean KL(baseline || candidate) over the positions (nats)."""
    max_kl_nats: float
    """The largest KL at one position (nats)."""


class NextTokenUnavailable(ReportRecord):
    """Why the next-token divergence was not measured (the models could not be loaded side by side)."""

    unavailable: str
    """The reason."""


NextToken = dict[str, NextTokenSuite] | NextTokenUnavailable
"""Suite name -> next-token divergence, or why it was not measured."""
