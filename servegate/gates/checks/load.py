"""The `load` gate: outputs and streams must hold under the declared concurrency, not only at rest.

After MLPerf's audits: TEST01 (the outputs logged during the performance run equal the accuracy run's)
and TEST06 (streamed answers agree with the final output and the reported token count). Over HTTP, so
the same code measures servegate's runtime and any OpenAI-compatible endpoint (gates/probes/http_target.py):

1. At rest: a sample of suite items, sent one at a time, non-streamed.
2. Under load: the same items again, each streamed and non-streamed (and once with a quarter of its
   max_tokens, so answers end on `length`), shuffled among other suite prompts so that `concurrency`
   requests are in flight at once (capacity.workload.concurrency when declared, else
   batching.max_batch_size; at most MAX_CONCURRENCY), and every sample item shares its batch.
3. Quality under load: each item's answer under load against its answer at rest, token-exact where the
   batching promises greedy equality (servegate's runtime promises it in every batching mode, up to numerical
   ties: an item that differs only from one on warns, gates/checks/batching_ties.py), else by
   the paired non-inferiority test on the suites' metrics (a remote promises nothing; the sample is then
   the n the test needs to show non-inferiority at the declared margin).
4. Streaming consistency (gates/probes/stream_checks.py) on every answer of the load phase.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

from servegate.contracts.diff import GATE_WATCHES
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.measurements import LoadMeasurements
from servegate.contracts.report.probes import QualityUnderLoad, StreamingUnderLoad, SuitePairedTest
from servegate.gates.base import Gate, GateContext
from servegate.gates.probes.http_target import Answer, HttpTarget, app_completion_body, load_concurrency, open_target
from servegate.gates.probes.stream_checks import streaming_consistency
from servegate.gates.quality.comparison import QualityComparison, compare_runs, margin_for
from servegate.gates.quality.statistics import exact_n_min
from servegate.gates.registry import register_gate
from servegate.gates.result import GateResult, Verdict, example
from servegate.gates.suites.evaluation import ItemOutput, SuiteData, SuiteItem, SuiteRun, make_suite_data, score_run

SAMPLE_PER_SUITE = 6
"""Items per suite compared token for token (the paired test takes as many as it needs instead)."""
LOAD_FACTOR = 2
"""The load phase sends at least this many times `concurrency` requests, so the server stays full."""
SEED = 25

Sample = list[tuple[SuiteData, SuiteItem]]


def promises_greedy_equality(served: ServedModel) -> bool:
    """Whether greedy outputs must be token-identical in any batch: servegate's runtime promises it, a remote not."""
    return not served.runtime.remote


def _sample(served: ServedModel, suites: list[SuiteData], exact: bool) -> Sample:
    """The items compared: a few per suite token for token, else as many as the paired test needs."""
    out: Sample = []
    for data in suites:
        n = SAMPLE_PER_SUITE
        if not exact:
            needed = [exact_n_min(margin_for(served, m), served.quality.confidence) for m in data.suite.metrics]
            n = max([SAMPLE_PER_SUITE, *(k for k in needed if k is not None)])
        out += [(data, item) for item in data.items[:n]]
    return out


def _load_jobs(served: ServedModel, suites: list[SuiteData], sample: Sample, concurrency: int) -> list[Any]:
    """(label, prompt, max_tokens, stream) of the load phase, shuffled.

    The sample twice (streamed and not); each sample item once more with a quarter of its max_tokens, so
    answers end on `length` and the cap and the exact usage are checked; then other prompts of the
    workload's output length until LOAD_FACTOR * concurrency requests are in the phase.
    """
    jobs = [(f"{d.name}/{i.id}", i.prompt, d.suite.max_tokens, stream) for d, i in sample for stream in (False, True)]
    jobs += [(f"other capped {d.name}/{i.id}", i.prompt, max(1, d.suite.max_tokens // 4), k % 2 == 0)
             for k, (d, i) in enumerate(sample)]  # fmt: skip
    taken = {(d.name, i.id) for d, i in sample}
    others = [(d, i) for d in suites for i in d.items if (d.name, i.id) not in taken] or sample
    workload = served.capacity.workload
    for k in range(max(0, LOAD_FACTOR * concurrency - len(jobs))):
        data, item = others[k % len(others)]
        cap = workload.output_tokens.mean if workload is not None else max(1, data.suite.max_tokens // 2)
        jobs.append((f"other {data.name}/{item.id}", item.prompt, max(1, min(cap, data.suite.max_tokens)), k % 2 == 1))
    random.Random(SEED).shuffle(jobs)
    return jobs


@dataclass
class _LoadRun:
    target: str
    rest: list[Answer]
    jobs: list[Any]
    answers: list[Answer]
    seconds: float
    streaming: StreamingUnderLoad
    problems: list[str]


async def _measure(ctx: GateContext, served: ServedModel, suites: list[SuiteData], sample: Sample,
                   concurrency: int) -> _LoadRun:  # fmt: skip
    """The at-rest pass and the load phase over one HTTP target, and the streaming checks on its answers."""
    jobs = _load_jobs(served, suites, sample, concurrency)
    title = f"load: {len(sample)} items alone, {len(jobs)} requests at {concurrency}"
    ctx.progress.start(title, len(sample) + len(jobs))
    async with open_target(ctx, served) as target:
        rest = []
        for data, item in sample:
            rest.append(await target.complete(item.prompt, data.suite.max_tokens, stream=False))
            ctx.progress.advance()
        window = asyncio.Semaphore(concurrency)

        async def one(job: Any) -> Answer:
            async with window:
                answer = await target.complete(job[1], job[2], stream=job[3])
            ctx.progress.advance()
            return answer

        began = time.perf_counter()
        answers = list(await asyncio.gather(*(one(job) for job in jobs)))
        seconds = time.perf_counter() - began
        streaming, problems = _streaming(served, target, jobs, answers, concurrency)
    return _LoadRun(target.label, rest, jobs, answers, seconds, streaming, problems)


def _streaming(served: ServedModel, target: HttpTarget, jobs: list[Any], answers: list[Answer],
               concurrency: int) -> tuple[StreamingUnderLoad, list[str]]:  # fmt: skip
    """Pair each sample item's streamed answer with its non-streamed twin; check everything else alone."""
    twins: dict[str, dict[bool, Answer]] = {}
    singles = []
    for job, answer in zip(jobs, answers, strict=True):
        if job[0].startswith("other "):
            singles.append((job[0], answer))
        else:
            twins.setdefault(job[0], {})[job[3]] = answer
    pairs = [(label, got[True], got[False]) for label, got in twins.items()]
    slack = max((len(s) for s in served.postprocess.stop), default=0)
    return streaming_consistency(pairs, singles, target.tokens_received, concurrency=concurrency, stop_slack=slack)


def _under_load(run: _LoadRun) -> dict[str, Answer]:
    """Each sample item's non-streamed answer under load, by label."""
    return {job[0]: a for job, a in zip(run.jobs, run.answers, strict=True) if not job[3] and job[0][:6] != "other "}


def _ties(ctx: GateContext, served: ServedModel, sample: Sample, differ: list[Any]) -> list[bool]:
    """Per differing item, whether it differs only from a numerical tie on (gates/checks/batching_ties.py): its
    request as servegate's server made it from the body the gate sent (app_completion_body), rerun alone with
    log-probabilities. Only answers that both carry the server's token ids are judged; the rest stay
    mismatches."""
    from servegate.contracts.requests import parse_request
    from servegate.gates.checks.batching_ties import judge_divergences
    from servegate.runtime.request_translator import engine_requests

    judged: list[tuple[int, Any]] = []
    for n, (k, rest, load) in enumerate(differ):
        if rest.ok and load.ok and rest.token_ids is not None and load.token_ids is not None:
            data, item = sample[k]
            body = app_completion_body(served, item.prompt, data.suite.max_tokens, stream=False)
            (request,) = engine_requests(served, parse_request(served, "completions", body), f"load-tie-{k}", None)
            judged.append((n, (request, _ids("rest", rest), _ids("load", load))))
    ties = [False] * len(differ)
    if judged:
        found = judge_divergences(ctx, served, [triple for _, triple in judged])
        for (n, _), divergence in zip(judged, found, strict=True):
            ties[n] = divergence.tie
    return ties


def _ids(label: str, answer: Answer) -> ItemOutput:
    """An answer with the server's token ids, as the tie judgement reads it."""
    return ItemOutput(label, answer.text, tuple(answer.token_ids or ()), token_source="engine")


def _outputs(label: str, answers: list[Answer]) -> list[ItemOutput]:
    return [ItemOutput(label, a.text if a.ok else None, error=None if a.ok else (a.error or str(a.status)))
            for a in answers]  # fmt: skip


def _paired(served: ServedModel, sample: Sample, rest: list[Answer], loaded: dict[str, Answer]) -> QualityComparison:
    """Paired non-inferiority of the suites' metrics: under load (candidate) against at rest (baseline)."""
    out = QualityComparison()
    names = list(dict.fromkeys(data.name for data, _ in sample))
    for name in names:
        rows = [(d, i, r) for (d, i), r in zip(sample, rest, strict=True) if d.name == name]
        data, items = rows[0][0], [i for _, i, _ in rows]
        subset = make_suite_data(data.suite, items, data.schema)
        base = _outputs("rest", [r for _, _, r in rows])
        cand = _outputs("load", [loaded[f"{name}/{i.id}"] for i in items])
        at_rest = SuiteRun(subset, base, score_run(subset, base))
        compare_runs(served, subset, at_rest, SuiteRun(subset, cand, score_run(subset, cand)), out)
    return out


@register_gate(
    "load",
    watches=GATE_WATCHES["load"],
    beside_others=True,
    purpose="Outputs at the declared concurrency equal those at rest; streams agree with twin, usage, max_tokens.",
)
class LoadGate(Gate):
    """Quality under load (MLPerf TEST01) and streaming consistency under load (TEST06), over HTTP."""

    def run(self, ctx: GateContext) -> GateResult:
        """Send the sample alone, then under load; compare the outputs and check every stream."""
        served = ctx.candidate
        if not served.runtime.remote:  # a response cache would answer the repeats from memory, hiding the engine
            post = served.postprocess.model_dump(mode="python")
            post["response_cache"] = {**post["response_cache"], "enabled": False}
            served = served.with_changes(postprocess=post)
        suites = [d for d in ctx.suites() if d.suite.lm_eval is None and d.items]
        if not suites:
            return self.result("warn", "no generation suites declared: no prompts to send under load")
        exact = promises_greedy_equality(served)
        sample = _sample(served, suites, exact)
        concurrency, source = load_concurrency(served)
        run = asyncio.run(_measure(ctx, served, suites, sample, concurrency))
        loaded = _under_load(run)
        differ = [
            (k, r, loaded[f"{d.name}/{i.id}"]) for k, ((d, i), r) in enumerate(zip(sample, run.rest, strict=True))
            if (r.text, r.ok) != (loaded[f"{d.name}/{i.id}"].text, loaded[f"{d.name}/{i.id}"].ok)
        ]  # fmt: skip
        refused = sum(not a.ok for a in loaded.values())
        paired = None if exact else _paired(served, sample, run.rest, loaded)
        ties = _ties(ctx, served, sample, differ) if exact else [False] * len(differ)
        differ = [d for d, tie in zip(differ, ties, strict=True) if not tie]
        quality = QualityUnderLoad(
            comparison="token-exact" if exact else "paired non-inferiority",
            items=len(sample),
            numerical_ties=sum(ties),
            mismatches=len(differ),
            mismatch_rate=round(len(differ) / len(sample), 6),
            refused_under_load=refused,
            tests=tuple(SuitePairedTest.model_validate({"suite": s, **t.to_dict()}) for s, t in paired.tests)
            if paired is not None
            else (),
        )
        measured = LoadMeasurements(
            target=run.target,
            concurrency=concurrency,
            concurrency_from=source,
            requests=len(run.jobs),
            load_phase_s=round(run.seconds, 3),
            throughput_rps=round(len(run.jobs) / run.seconds, 3) if run.seconds > 0 else 0.0,
            quality=quality,
            streaming=run.streaming,
        )
        evidence = self._examples(ctx, sample, differ) + [{"problem": p} for p in run.problems[:5]]
        return self._verdict(measured, sample, differ, paired, run.problems, evidence)

    def _examples(self, ctx: GateContext, sample: Sample, differ: list[Any]) -> list[dict[str, Any]]:
        out = []
        for k, rest, load in differ[: ctx.candidate.quality.max_failure_examples]:
            data, item = sample[k]
            out.append(example(item.id, data.suite.public, suite=data.name, prompt=item.prompt,
                               baseline=rest.text, candidate=load.text if load.ok else f"<error {load.error}>",
                               reference="the same item sent alone"))  # fmt: skip
        return out

    def _verdict(self, m: LoadMeasurements, sample: Sample, differ: list[Any], paired: QualityComparison | None,
                 problems: list[str], evidence: list[dict[str, Any]]) -> GateResult:  # fmt: skip
        data = m
        at = f"at concurrency {m.concurrency} ({m.requests} requests)"
        if paired is None and differ:
            d, i = sample[differ[0][0]]
            reason = (f"outputs change under load: {len(differ)} of {len(sample)} sample outputs {at} differ from "
                      f"the same items sent alone (first: {d.name}/{i.id})")  # fmt: skip
            return self.result("fail", reason, data, evidence)
        if paired is not None and paired.verdict == "fail":
            return self.result("fail", f"quality under load {at}: {paired.reason()}", data, evidence)
        if problems:
            return self.result("fail", f"streaming under load {at}: {problems[0]} ({len(problems)} problem(s))",
                               data, evidence)  # fmt: skip
        streams = f"{m.streaming.streams} streams equal their twin; usage, end of sequence and max_tokens hold"
        if paired is not None:
            verdict: Verdict = "warn" if paired.verdict == "warn" else "pass"
            return self.result(verdict, f"under load {at}: {paired.reason()}; {streams}", data, evidence)
        tied = m.quality.numerical_ties
        if tied:
            alone = (f"{len(sample) - tied} sample outputs equal those sent alone (token-exact), {tied} differ "
                     "only from a numerical tie on (docs/under-load.md)")  # fmt: skip
            return self.result("warn", f"under load {at}: {alone}; {streams}", data)
        alone = f"{len(sample)} sample outputs equal those sent alone (token-exact)"
        return self.result("pass", f"under load {at}: {alone}; {streams}", data)
