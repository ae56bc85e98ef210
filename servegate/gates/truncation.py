"""The `truncation` gate: an input limit and its policy must not cost quality, and must be what users get.

Items whose prompt fits under both limits see exactly the same input, so their outputs are the
baseline's; the gate runs the candidate on every item it can affect plus a sample of the others (which
must come back unchanged), and tests the whole suite, paired, with the candidate's results spliced in.
"""

from __future__ import annotations

from typing import Any

from servegate.gates.base import Gate, GateContext
from servegate.gates.comparison import QualityComparison, compare_runs, margin_for
from servegate.gates.evaluation import ItemOutput, SuiteRun, score_run
from servegate.gates.registry import register_gate
from servegate.gates.result import GateResult, example
from servegate.gates.statistics import paired_noninferiority

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
    watches=TRUNCATION_FIELDS,
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
        per_suite: dict[str, Any] = {}
        subset_notes: list[str] = []
        for data in ctx.suites():
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

            for i in others:
                out, ref = by_index[i], base.outputs[i]
                if out.error is not None or out.truncated_tokens or out.token_ids != ref.token_ids:
                    problems.append(f"{data.name}/{data.items[i].id}: an item under the limit came back changed")
            for i in affected:
                out, n = by_index[i], full[i]
                if n is None or n <= limit:
                    continue
                if policy == "reject":
                    if out.error != "input_too_long":
                        what = (
                            f"error {out.error}" if out.error else f"an answer ({out.truncated_tokens} tokens dropped)"
                        )
                        problems.append(
                            f"{data.name}/{data.items[i].id}: {n} tokens > {limit} got {what}, not input_too_long"
                        )
                elif out.error is not None:
                    problems.append(f"{data.name}/{data.items[i].id}: truncation {policy} answered error {out.error}")
                elif out.truncated_tokens != n - limit:
                    problems.append(
                        f"{data.name}/{data.items[i].id}: usage.truncated_tokens is {out.truncated_tokens}, "
                        f"but {n - limit} of {n} tokens were over the limit"
                    )

            outputs = [by_index.get(i, base.outputs[i]) for i in range(len(data.items))]
            spliced = SuiteRun(data, outputs, score_run(data, outputs))
            compare_runs(ctx.candidate, data, base, spliced, comparison)
            over = [i for i in affected if full[i] is not None and full[i] > limit]
            lost = [by_index[i].truncated_tokens for i in over if by_index[i].error is None]
            first = data.suite.metrics[0]
            suite_m: dict[str, Any] = {
                "items": len(data.items),
                "over_limit": len(over),
                "share_over_limit": round(len(over) / len(data.items), 6) if data.items else 0.0,
                "over_reference_limit": sum(n is None for n in full),
                "unaffected_rechecked": len(others),
                "tokens_lost_total": sum(lost),
                "tokens_lost_mean": round(sum(lost) / len(lost), 3) if lost else 0.0,
                "tokens_lost_max": max(lost, default=0),
                "rejected": sum(by_index[i].error == "input_too_long" for i in over),
            }
            if over:
                b_sub = [base.scores[first][i] for i in over]
                c_sub = [spliced.scores[first][i] for i in over]
                sub = paired_noninferiority(
                    b_sub,
                    c_sub,
                    margin=margin_for(ctx.candidate, first),
                    confidence=ctx.candidate.quality.confidence,
                    metric=first,
                )
                suite_m["over_limit_scores"] = {
                    "metric": first,
                    "full_context": sub.baseline_score,
                    "under_policy": sub.candidate_score,
                }
                if sub.verdict == "fail":
                    subset_notes.append(
                        f"{data.name}: the {len(over)} prompts over {limit} tokens drop {first} "
                        f"{sub.baseline_score:.3f} -> {sub.candidate_score:.3f}"
                    )
            per_suite[data.name] = suite_m

        measurements: dict[str, Any] = {"limit_tokens": limit, "policy": policy, "per_suite": per_suite}
        measurements.update(comparison.measurements())
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
        measurements["long_prompt_notes"] = subset_notes
        return self.result(verdict, reason, measurements, evidence)
