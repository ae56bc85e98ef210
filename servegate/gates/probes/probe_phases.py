"""Probes sent alone and under load, streamed and not, for the contract gate's checks that hold on every answer
or not at all (output constraints, forced tool calls): the phases they run in, their counts and their verdict.

Each probe (a constraint kind, a tool_choice mode) is sent with the suites' prompts at concurrency 1 and at the
declared concurrency (`http_target.load_concurrency`), streamed and not: max(MIN_REQUESTS, 2 x concurrency)
requests per probe and phase under load, and each prompt once alone (phase_prompts). A judge says of
each answer whether it ended (so can be judged) and why it is broken, if it is; one broken answer fails the
check, and a probe none of whose answers ended is not verified.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from servegate.contracts.report.probes import ProbePhase, ProbesUnderLoad
from servegate.gates.base import GateContext
from servegate.gates.probes.contract_measure import FieldCheck
from servegate.gates.probes.http_target import Answer, HttpTarget, load_concurrency

MIN_REQUESTS = 8
"""Requests per probe and phase at least (and at least twice the concurrency, so the server stays full)."""

T = TypeVar("T")

Send = Callable[[HttpTarget, str, str, bool], Awaitable[Answer]]
"""(target, probe, prompt, stream) -> the answer."""
Judge = Callable[[str, Answer], tuple[bool, str | None]]
"""(probe, answer) -> (whether it ended, so is judged; why it is broken, or None)."""


def phase_prompts(prompts: Sequence[T], concurrency: int, n: int) -> dict[int, list[T]]:
    """The prompts each phase sends, by concurrency: alone (1) each prompt given once, at most n; at the load
    level n of them cycled, so the server stays full. The probes are greedy, so a prompt sent again alone is the
    same request with the same answer: on the real example (examples/smollm2) the repeats were 12 of each alone
    phase's 32 requests and showed nothing the first answer had not; without them its contract gate took 425.2 s
    instead of 556.3 s (benchmarks/README.md)."""
    return {1: list(prompts[:n]), concurrency: [prompts[k % len(prompts)] for k in range(n)]}


async def run_phases(
    ctx: GateContext, target: HttpTarget, probes: list[str], prompts: list[str], send: Send, judge: Judge, what: str
) -> ProbesUnderLoad:
    """Every probe in its four phases over `target`, with a progress bar named `what`."""
    concurrency, _ = load_concurrency(ctx.candidate)
    plan = phase_prompts(prompts, concurrency, max(MIN_REQUESTS, 2 * concurrency))
    phases: list[ProbePhase] = []
    first: str | None = None
    total = 2 * len(probes) * sum(len(chosen) for chosen in plan.values())
    ctx.progress.start(f"contract: {what} at 1 and {concurrency}", total)
    for probe in probes:
        for level, chosen in plan.items():
            for stream in (False, True):
                phase, broken = await _phase(ctx, target, (probe, level, stream), chosen, send, judge)
                phases.append(phase)
                first = first or broken
    return ProbesUnderLoad(target=target.label, phases=tuple(phases), first_broken=first)


async def _phase(
    ctx: GateContext, target: HttpTarget, where: tuple[str, int, bool], prompts: list[str], send: Send, judge: Judge
) -> tuple[ProbePhase, str | None]:
    """One probe at one concurrency, streamed or not: the phase's counts, and its first broken answer."""
    probe, level, stream = where
    window = asyncio.Semaphore(level)

    async def one(prompt: str) -> Answer:
        async with window:
            answer = await send(target, probe, prompt, stream)
        ctx.progress.advance()
        return answer

    answers = list(await asyncio.gather(*(one(p) for p in prompts)))
    judged = [judge(probe, a) for a in answers]
    ended, broken = sum(e for e, _ in judged), sum(why is not None for _, why in judged)
    first = next((why for _, why in judged if why), None)
    phase = ProbePhase(probe=probe, concurrency=level, stream=stream, answers=len(answers), ended=ended, broken=broken)
    return phase, first


def phases_check(field: str, measured: ProbesUnderLoad, broken_as: str, silent_as: str, held_as: str) -> FieldCheck:
    """The field check of a probe run: a problem when any answer broke (`broken_as`: what they broke), not
    verified when some probe's answers never ended (`silent_as`: why none could be judged), else measured
    (`held_as`: what every judged answer did)."""
    requests = sum(p.answers for p in measured.phases)
    broken = sum(p.broken for p in measured.phases)
    ended: dict[str, int] = {}
    for phase in measured.phases:
        ended[phase.probe] = ended.get(phase.probe, 0) + phase.ended
    if broken:
        where = sorted({f"{p.probe} at concurrency {p.concurrency}" for p in measured.phases if p.broken})
        problem = f"{broken} answer(s) {broken_as} ({', '.join(where)}); first: {measured.first_broken}"
        return FieldCheck(field, "measured", f"{broken} of {requests} answers broken", problem, requests)
    silent = [probe for probe, count in ended.items() if count == 0]
    if silent:
        return FieldCheck(field, "not verified", f"no {', '.join(silent)} answer {silent_as}", None, requests)
    detail = f"all {sum(ended.values())} ended answers {held_as} ({', '.join(ended)}, alone and under load)"
    return FieldCheck(field, "measured", detail, None, requests)
