"""Paired quality comparison of two manifests on the same suite items, shared by the quality gates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.quality import OutputLength, SuiteScores
from servegate.gates.base import GateContext
from servegate.gates.quality.output_length import length_reason, output_length
from servegate.gates.quality.statistics import PairedComparison, paired_noninferiority
from servegate.gates.result import Verdict, example, worst
from servegate.gates.suites.evaluation import SuiteData, SuiteItem, SuiteRun


@dataclass
class QualityComparison:
    """Per suite and metric non-inferiority results, with failure examples."""

    tests: list[tuple[str, PairedComparison]] = field(default_factory=list)
    """(suite name, comparison) for every declared metric of every suite."""
    evidence: list[dict[str, Any]] = field(default_factory=list)
    suites: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Suite name -> suite-level numbers of both sides."""
    lengths: list[OutputLength] = field(default_factory=list)
    """The output-length guard of every suite compared (quality.length_band)."""
    timed_out: dict[str, int] = field(default_factory=dict)
    """Suite name -> items left out of its paired tests because either side ended deadline_exceeded."""

    @property
    def verdict(self) -> Verdict:
        """The worst verdict over all tests and length guards (skipped when nothing was compared); at best a
        warning where items hit their deadline, which says how busy the machine was, not how good the answers."""
        if not self.tests:
            return "skipped"
        timing: list[Verdict] = ["warn"] if self.timed_out else []
        return worst([*(c.verdict for _, c in self.tests), *(g.verdict for g in self.lengths), *timing])

    def reason(self) -> str:
        """The first failing (else warning, else passing) test's reason, prefixed with its suite and metric."""
        if not self.tests:
            return "no eval suites declared (quality.suites is empty)"
        for suite, test in self.tests:
            if test.verdict == "fail":
                return f"{suite}/{test.metric}: {test.reason}"
        if self.timed_out:
            return f"inconclusive: {self._timed_out()}"
        for wanted in ("fail", "warn"):
            for suite, test in self.tests:
                if test.verdict == wanted:
                    return f"{suite}/{test.metric}: {test.reason}"
            for guard in self.lengths:
                if guard.verdict == wanted:
                    return f"output length changed although the metrics hold: {length_reason(guard)}"
        suite, weakest = min(self.tests, key=lambda t: t[1].lower + t[1].margin)
        ratios = [g.ratio for g in self.lengths if g.ratio is not None]
        length = f"; output length ratio {min(ratios):.2f}-{max(ratios):.2f} in band" if ratios else ""
        return (
            f"non-inferior on all {len(self.tests)} suite metrics; tightest {suite}/{weakest.metric}: "
            f"lower bound {weakest.lower:+.4f} > -{weakest.margin:g} (n={weakest.n}, {weakest.confidence:.0%}){length}"
        )

    def _timed_out(self) -> str:
        counts = ", ".join(f"{n} of {suite}" for suite, n in self.timed_out.items())
        return (
            f"items ended deadline_exceeded ({counts}) and were left out of the paired tests: a deadline measures "
            "how fast this machine ran, not the answers; raise failure_policy.request_timeout_s to judge them, "
            "and gate speed with capacity targets"
        )

    def suite_scores(self) -> dict[str, SuiteScores]:
        """Suite name -> its suite-level numbers and per-metric tests, in the order the suites were tested."""
        lengths = {g.suite: g for g in self.lengths}
        return {
            suite: SuiteScores.model_validate(
                {
                    **self.suites.get(suite, {}),
                    "metrics": {c.metric: c for s, c in self.tests if s == suite},
                    "output_length": lengths.get(suite),
                }
            )
            for suite in dict.fromkeys(s for s, _ in self.tests)
        }


DEADLINE = "deadline_exceeded"
"""The error that says how fast a machine ran, not what the model answered: its items leave the paired tests."""


def margin_for(served: ServedModel, metric: str) -> float:
    """The declared non-inferiority margin of a metric."""
    return served.quality.margins.get(metric, served.quality.default_margin)


def compare_runs(
    served: ServedModel,
    data: SuiteData,
    base: SuiteRun,
    cand: SuiteRun,
    out: QualityComparison,
    items: Sequence[SuiteItem] | None = None,
) -> None:
    """Add the paired tests of every metric of one suite, and up to k failure examples, to `out`."""
    chosen = list(data.items if items is None else items)
    quality = served.quality
    kept = [
        i for i, (b, c) in enumerate(zip(base.outputs, cand.outputs, strict=True)) if DEADLINE not in (b.error, c.error)
    ]
    if len(kept) < len(base.outputs):
        out.timed_out[data.name] = out.timed_out.get(data.name, 0) + len(base.outputs) - len(kept)
    for metric in data.suite.metrics:
        test = paired_noninferiority(
            [base.scores[metric][i] for i in kept],
            [cand.scores[metric][i] for i in kept],
            margin=margin_for(served, metric),
            confidence=quality.confidence,
            metric=metric,
        )
        out.tests.append((data.name, test))
    if all(g.suite != data.name for g in out.lengths):  # a suite compared twice keeps its first guard
        tokens = not served.runtime.remote
        guard = output_length(data.name, base.outputs, cand.outputs, quality.length_band, tokens=tokens)
        out.lengths.append(guard)
    first = data.suite.metrics[0]
    room = quality.max_failure_examples - sum(e["suite"] == data.name for e in out.evidence)
    for item, b_out, c_out, b_score, c_score in zip(
        chosen, base.outputs, cand.outputs, base.scores[first], cand.scores[first], strict=True
    ):
        if room <= 0:
            break
        if c_score < b_score:
            out.evidence.append(
                example(
                    item.id,
                    data.suite.public,
                    suite=data.name,
                    prompt=item.prompt,
                    reference=item.reference,
                    baseline=b_out.text if b_out.error is None else f"<error {b_out.error}>",
                    candidate=c_out.text if c_out.error is None else f"<error {c_out.error}>",
                )
            )
            room -= 1


def compare_on_suites(ctx: GateContext, baseline: ServedModel, candidate: ServedModel) -> QualityComparison:
    """Run every suite on both manifests (baseline outputs from the cache when warm) and test each metric."""
    out = QualityComparison()
    for data in ctx.suites():
        base = ctx.run_suite(baseline, data, role="baseline")
        cand = ctx.run_suite(candidate, data, role="candidate")
        out.suites[data.name] = {
            "items": len(data.items),
            "baseline_from_cache": base.from_cache,
            "candidate_errors": sum(o.error is not None for o in cand.outputs),
        }
        if data.suite.lm_eval is not None:  # lm-eval's own aggregate, comparable with numbers published elsewhere
            from servegate.gates.lm_eval.tasks import lm_eval_aggregate

            out.suites[data.name]["lm_eval_aggregate"] = {
                "baseline": lm_eval_aggregate(ctx.candidate, data, base.scores),
                "candidate": lm_eval_aggregate(ctx.candidate, data, cand.scores),
            }
        compare_runs(ctx.candidate, data, base, cand, out)
    return out
