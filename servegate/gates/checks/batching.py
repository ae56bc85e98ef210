"""The `batching` gate: a request's greedy output must not depend on what else is in its batch.

Each probe runs on the unbatched reference (`batching: none`), then on the candidate's batching mode one at
a time and inside batches of different size, composition and order; every output must equal the
unbatched one, text and tokens (a remote's tokens as it named them in its logprobs; where it named none,
its text re-tokenized, and the text decides: `token_source` in the report). A
request whose deadline has already passed must end in `deadline_exceeded`, and no request may finish
after its deadline. An output that differs only from a numerical tie on (the unbatched reference ranks the
batch's token within TIE_MARGIN_NATS of its own where they part: float sums reassociated by the batch's size,
batching_ties.py) warns instead of failing.
"""

from __future__ import annotations

import random
import time
from itertools import groupby
from typing import Any

from servegate.contracts.diff import GATE_WATCHES
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.measurements import BatchingMeasurements
from servegate.gates.base import Gate, GateContext, GateSetupError
from servegate.gates.checks.batching_ties import TIE_MARGIN_NATS, Divergence, judge_divergences
from servegate.gates.registry import register_gate
from servegate.gates.result import GateResult, example
from servegate.gates.suites.evaluation import (
    ItemOutput,
    SuiteData,
    SuiteItem,
    generate,
    make_suite_data,
    probe_items,
    requests_for,
    same_output,
    token_sources,
)
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest

PROBES_PER_SUITE = 12
DEADLINE_SLACK_S = 0.25
"""Tolerance on e2e_s <= deadline for scheduling jitter, in seconds."""


def without_caches(served: ServedModel) -> ServedModel:
    """The same manifest with prefix and response caches and the fallback off (so only batching differs)."""
    rt = served.runtime.model_dump(mode="python")
    if rt.get("kv_cache") is not None:
        rt["kv_cache"] = {**rt["kv_cache"], "prefix_caching": False}
    post = served.postprocess.model_dump(mode="python")
    post["response_cache"] = {**post["response_cache"], "enabled": False}
    fail = {**served.failure_policy.model_dump(mode="python"), "fallback": None}
    return served.with_changes(runtime=rt, postprocess=post, failure_policy=fail)


def _tokens_from(source: str) -> str:
    """Where the compared tokens came from, for the reason line (nothing for the engine's own ids)."""
    return "" if source in ("engine", "none") else f" (candidate tokens: {source})"


def arrangements(n: int, max_batch: int, seed: int = 0) -> list[tuple[str, list[list[int]]]]:
    """Ways to run n probes: all in order, reversed, and shuffled into batches of varied sizes."""
    rng = random.Random(seed)
    order = list(range(n))
    out = [("one batch, in order", [order]), ("one batch, reversed", [order[::-1]])]
    shuffled = order[:]
    rng.shuffle(shuffled)
    sizes = [s for s in (2, 3, 5, 7, 11, 13) if s <= max(2, max_batch)]
    batches: list[list[int]] = []
    start = 0
    while start < n:
        size = sizes[len(batches) % len(sizes)]
        batches.append(shuffled[start : start + size])
        start += size
    out.append((f"shuffled, batches of {', '.join(map(str, sorted({len(b) for b in batches})))}", batches))
    return out


@register_gate(
    "batching",
    watches=GATE_WATCHES["batching"],
    beside_others=True,
    purpose="Greedy outputs are identical alone and in any batch, and deadlines are honoured.",
)
class BatchingGate(Gate):
    """Batch invariance (mismatch rate and examples) and deadlines, on the candidate's batching mode."""

    def run(self, ctx: GateContext) -> GateResult:
        """Compare every probe in every arrangement with its output from the unbatched reference."""
        fields = ("batching", "runtime.kv_cache.block_size", "runtime.kv_cache.memory_budget")
        try:
            served = without_caches(ctx.isolated((*fields, "failure_policy.request_timeout_s")))
        except GateSetupError:  # the batching does not fit the baseline's limits: test the candidate as declared
            served = without_caches(ctx.candidate)
        probes = probe_items(ctx.suites(), PROBES_PER_SUITE)
        if not probes:
            return self.result("warn", "no eval suites declared: no probes to send")
        requests = [requests_for(data, [item])[0] for data, item in probes]
        layouts = [("one at a time", [[i] for i in range(len(requests))])]
        layouts += arrangements(len(requests), served.batching.max_batch_size)
        alone = self._unbatched_outputs(ctx, probes)
        ctx.progress.start(f"batching: {served.batching.mode}", len(requests) * len(layouts) + 1)
        engine = ctx.engines.get(served, tag="batching")

        mismatches: list[tuple[str, int, ItemOutput]] = []
        seen: list[ItemOutput] = []
        late: list[str] = []
        compared = 0
        for label, batches in layouts:
            for batch in batches:
                with ctx.split.phase("candidate outputs"):
                    results = generate(engine, [requests[i] for i in batch])
                for i, result in zip(batch, results, strict=True):
                    got = ItemOutput.from_result(requests[i].id, result)
                    compared += 1
                    seen.append(got)
                    if not same_output(got, alone[i]):
                        mismatches.append((label, i, got))
                    if isinstance(result, FinishEvent) and result.e2e_s is not None:
                        if result.e2e_s > served.failure_policy.request_timeout_s + DEADLINE_SLACK_S:
                            late.append(f"{requests[i].id} finished after {result.e2e_s:.2f} s")
                ctx.progress.advance(len(batch))

        expired = self._expired_request(engine)
        ctx.progress.advance()
        rate = len(mismatches) / compared if compared else 0.0
        divergences = self._divergences(ctx, requests, alone, mismatches)
        faults = [m for m, d in zip(mismatches, divergences, strict=True) if not d.tie]
        measurements = BatchingMeasurements(
            mode=served.batching.mode,
            max_batch_size=served.batching.max_batch_size,
            probes=len(probes),
            arrangements=[label for label, _ in layouts],
            outputs_compared=compared,
            mismatches=len(mismatches),
            mismatch_rate=round(rate, 6),
            expired_request=expired,
            finished_after_deadline=len(late),
            token_source=token_sources(seen),
            numerical_ties=len(mismatches) - len(faults),
        )
        evidence = []
        shown = ctx.candidate.quality.max_failure_examples
        for (label, i, got), found in list(zip(mismatches, divergences, strict=True))[:shown]:
            data, item = probes[i]
            margin = {} if found.margin_nats is None else {"margin_nats": found.margin_nats}
            evidence.append(
                example(item.id, data.suite.public, suite=data.name, prompt=item.prompt, baseline=alone[i].text,
                        candidate=got.text, arrangement=label, reference="unbatched", first_difference=found.position,
                        numerical_tie=found.tie, **margin)
            )  # fmt: skip
        if faults:
            label, i, _ = faults[0]
            ties = f"; {len(mismatches) - len(faults)} more at numerical ties" if len(faults) < len(mismatches) else ""
            return self.result(
                "fail",
                f"outputs depend on the batch: {len(faults)} of {compared} outputs differ "
                f"(first: {probes[i][0].name}/{probes[i][1].id}, {label}){ties}",
                measurements,
                evidence,
            )
        if expired != "deadline_exceeded":
            return self.result(
                "fail", f"a request past its deadline ended as {expired}, not deadline_exceeded", measurements
            )
        if late:
            return self.result("fail", f"deadline not honoured: {late[0]}", measurements)
        if mismatches:
            closest = max(d.margin_nats or 0.0 for d in divergences)
            label, i, _ = mismatches[0]
            return self.result(
                "warn",
                f"batch invariant up to numerical ties: {len(mismatches)} of {compared} outputs differ, each first at "
                f"a token the unbatched reference ranks within {closest:.1e} nats of its own (tie limit "
                f"{TIE_MARGIN_NATS:g}): float sums reassociated by the batch's size, not one request reading "
                f"another's (first: {probes[i][0].name}/{probes[i][1].id}, {label}); expired request -> "
                "deadline_exceeded",
                measurements,
                evidence,
            )
        return self.result(
            "pass",
            f"batch invariant: {compared} outputs in {len(layouts)} arrangements ({served.batching.mode}) equal "
            f"the unbatched reference{_tokens_from(measurements.token_source)}; expired request -> deadline_exceeded",
            measurements,
        )

    @staticmethod
    def _divergences(
        ctx: GateContext,
        requests: list[GenerationRequest],
        alone: list[ItemOutput],
        mismatches: list[tuple[str, int, ItemOutput]],
    ) -> list[Divergence]:
        """Where each mismatch parts from the unbatched reference and whether it is a numerical tie (batching_ties);
        a probe that differs in several arrangements is judged once per distinct batched answer."""
        if not mismatches:
            return []
        distinct = {(i, got.token_ids): (requests[i], alone[i], got) for _, i, got in mismatches}
        judged = judge_divergences(ctx, without_caches(ctx.unbatched), list(distinct.values()))
        by_key = dict(zip(distinct, judged, strict=True))
        return [by_key[(i, got.token_ids)] for _, i, got in mismatches]

    @staticmethod
    def _unbatched_outputs(ctx: GateContext, probes: list[tuple[SuiteData, SuiteItem]]) -> list[ItemOutput]:
        """The probes' outputs on the unbatched reference, in the order of `probes`.

        Each suite's probes run as a baseline suite of their own, so a warm check reads them from the cache.
        """
        reference = without_caches(ctx.unbatched)
        outputs: list[ItemOutput] = []
        for data, group in groupby(probes, key=lambda probe: probe[0]):
            subset = make_suite_data(data.suite, [item for _, item in group], data.schema)
            outputs += ctx.run_suite(reference, subset, role="baseline").outputs
        return outputs

    @staticmethod
    def _expired_request(engine: Any) -> str:
        """Submit a request whose deadline passed before it arrived; return how it ended."""
        request = GenerationRequest(
            id="servegate-expired", prompt="1+1=", arrival_time=time.monotonic() - 10.0, timeout_s=1.0
        )
        (result,) = generate(engine, [request])
        if isinstance(result, ErrorEvent):
            return result.error.code
        return "an answer"
