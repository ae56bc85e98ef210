"""The `truncation` gate: an input limit and its policy must not cost quality, and must be what users get.

Items whose prompt fits under both limits see exactly the same input, so their outputs are the
baseline's; the gate runs the candidate on every item it can affect plus a sample of the others (which
must come back unchanged), and tests the whole suite, paired, with the candidate's results spliced in.
"""

from __future__ import annotations

from servegate.contracts.diff import GATE_WATCHES
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.quality_measurements import OverLimitScores, TruncationMeasurements, TruncationSuite
from servegate.gates.base import Gate, GateContext
from servegate.gates.quality.comparison import QualityComparison, compare_runs, margin_for
from servegate.gates.quality.statistics import paired_noninferiority
from servegate.gates.registry import register_gate
from servegate.gates.result import GateResult, example
from servegate.gates.suites.evaluation import ItemOutput, SuiteData, SuiteRun, same_output, score_run, token_sources

TRUNCATION_FIELDS = (
    "preprocess.max_input_tokens",
    "preprocess.truncation",
    "runtime.max_model_len",
    "postprocess.max_output_tokens",
)
UNDER_LIMIT_SAMPLE = 16
"""Unaffected items re-run per suite to confirm that they really are unaffected."""


def _spread(indices: list[int], k: int) -> list[int]:
    """Up to k indices spread evenly over the list."""
    if len(indices) <= k:
        return indices
    return [indices[round(j * (len(indices) - 1) / (k - 1))] for j in range(k)] if k > 1 else indices[:1]


@register_gate(
    "truncation",
    watches=GATE_WATCHES["truncation"],
    beside_others=True,
    shares="evaluation baseline",
    purpose="An input limit and truncation policy lose no quality beyond the margin, and report the tokens dropped.",
)
class TruncationGate(Gate):
    """Share of items over the limit, their metric under the policy vs full context, tokens lost, rejections."""

    def run(self, ctx: GateContext) -> GateResult:
        """Run the candidate's limit and policy on the items it affects; test the whole suite, paired."""
        candidate = ctx.isolated(TRUNCATION_FIELDS)
        limit, policy = candidate.preprocess.max_input_tokens, candidate.preprocess.truncation
        if not ctx.candidate.quality.suites:
            return self.result("warn", "no eval suites declared (quality.suites): truncation cannot be judged")
        comparison = QualityComparison()
        problems: list[str] = []
        subset_notes: list[str] = []
        answered: list[ItemOutput] = []
        per_suite = {
            data.name: _suite(ctx, candidate, data, comparison, problems, subset_notes, answered)
            for data in ctx.suites()
        }
        measurements = TruncationMeasurements(
            limit_tokens=limit,
            policy=policy,
            per_suite=per_suite,
            suites=comparison.suite_scores(),
            token_source=token_sources(answered),
        )
        evidence = comparison.evidence
        if problems:
            evidence = evidence + [
                example("-", False, suite="behaviour", prompt="", baseline=None, candidate=None, problem=p)
                for p in problems[: ctx.candidate.quality.max_failure_examples]
            ]
            return self.result("fail", f"{problems[0]} ({len(problems)} problem(s))", measurements, evidence)
        verdict = comparison.verdict
        reason = comparison.reason()
        if verdict == "pass" and subset_notes:
            verdict, reason = "warn", f"suites pass overall, but {subset_notes[0]}"
        return self.result(verdict, reason, measurements.updated(long_prompt_notes=subset_notes), evidence)


def _suite(
    ctx: GateContext,
    candidate: ServedModel,
    data: SuiteData,
    comparison: QualityComparison,
    problems: list[str],
    subset_notes: list[str],
    answered: list[ItemOutput],
) -> TruncationSuite:
    """Run one suite's affected items (and a sample of the rest) under the limit; add its paired tests to
    `comparison`, behaviour problems to `problems`, a failing over-limit subset to `subset_notes` and the
    candidate's outputs to `answered`."""
    limit, policy = candidate.preprocess.max_input_tokens, candidate.preprocess.truncation
    base = ctx.run_suite(ctx.baseline, data, role="baseline")
    full = [o.prompt_tokens + o.truncated_tokens if o.error is None else None for o in base.outputs]
    affected = [
        i
        for i, (o, n) in enumerate(zip(base.outputs, full, strict=True))
        if n is None or n > limit or o.truncated_tokens > 0
    ]
    others = _spread([i for i in range(len(full)) if i not in set(affected)], UNDER_LIMIT_SAMPLE)
    run_idx = affected + others
    items = [data.items[i] for i in run_idx]
    got = ctx.run_suite(candidate, data, role="candidate", items=items).outputs if items else []
    by_index: dict[int, ItemOutput] = dict(zip(run_idx, got, strict=True))
    answered += got

    for i in others:
        out, ref = by_index[i], base.outputs[i]
        if out.error is not None or out.truncated_tokens or not same_output(out, ref):
            problems.append(f"{data.name}/{data.items[i].id}: an item under the limit came back changed")
    for i in affected:
        n = full[i]
        if n is not None and n > limit:
            problems += _policy_problems(f"{data.name}/{data.items[i].id}", by_index[i], n, limit, policy)

    outputs = [by_index.get(i, base.outputs[i]) for i in range(len(data.items))]
    spliced = SuiteRun(data, outputs, score_run(data, outputs))
    compare_runs(ctx.candidate, data, base, spliced, comparison)
    over = [i for i in affected if (tokens := full[i]) is not None and tokens > limit]
    lost = [by_index[i].truncated_tokens for i in over if by_index[i].error is None]
    first = data.suite.metrics[0]
    scores = None
    if over:
        sub = paired_noninferiority(
            [base.scores[first][i] for i in over],
            [spliced.scores[first][i] for i in over],
            margin=margin_for(ctx.candidate, first),
            confidence=ctx.candidate.quality.confidence,
            metric=first,
        )
        scores = OverLimitScores(metric=first, full_context=sub.baseline_score, under_policy=sub.candidate_score)
        if sub.verdict == "fail":
            subset_notes.append(
                f"{data.name}: the {len(over)} prompts over {limit} tokens drop {first} "
                f"{sub.baseline_score:.3f} -> {sub.candidate_score:.3f}"
            )
    return TruncationSuite(
        items=len(data.items),
        over_limit=len(over),
        share_over_limit=round(len(over) / len(data.items), 6) if data.items else 0.0,
        over_reference_limit=sum(n is None for n in full),
        unaffected_rechecked=len(others),
        tokens_lost_total=sum(lost),
        tokens_lost_mean=round(sum(lost) / len(lost), 3) if lost else 0.0,
        tokens_lost_max=max(lost, default=0),
        rejected=sum(by_index[i].error == "input_too_long" for i in over),
        over_limit_scores=scores,
    )


def _policy_problems(where: str, out: ItemOutput, n: int, limit: int, policy: str) -> list[str]:
    """What is wrong with the answer to a prompt of `n` tokens over the limit under `policy` (nothing when right)."""
    if policy == "reject":
        if out.error != "input_too_long":
            what = f"error {out.error}" if out.error else f"an answer ({out.truncated_tokens} tokens dropped)"
            return [f"{where}: {n} tokens > {limit} got {what}, not input_too_long"]
    elif out.error is not None:
        return [f"{where}: truncation {policy} answered error {out.error}"]
    elif out.truncated_tokens != n - limit:
        dropped = out.truncated_tokens
        return [f"{where}: usage.truncated_tokens is {dropped}, but {n - limit} of {n} tokens were over the limit"]
    return []
