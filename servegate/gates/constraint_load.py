"""Output constraints alone and under load, for the contract gate: every answer its constraint ended satisfies it.

When `postprocess.structured_output` is declared, each kind it allows gets a probe constraint (the manifest's
output_schema for json_schema, where declared), sent with the suites' prompts at concurrency 1 and at the
declared concurrency (gates/load.py `load_concurrency`), streamed and not, over the same HTTP target as the load
gate: servegate's server in process, or the remote directly (which shows whether the remote honours
`structured_outputs` at all). An answer that ends (finish_reason stop) and breaks its constraint, checked by
other code than the mask (runtime/postprocess.constraint_problem), or that the server refuses as
invalid_output, fails the gate: a mask holds on every answer or it is broken, so there is no margin. Answers cut
short by max_tokens are counted, not judged; a kind none of whose answers ended is named as not verified.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from servegate.contracts.constraint_fields import ANY_JSON_OBJECT, OutputConstraint
from servegate.contracts.manifest import ServedModel
from servegate.gates.base import GateContext
from servegate.gates.contract_measure import FieldCheck
from servegate.gates.http_target import Answer, HttpTarget, open_target
from servegate.gates.load import load_concurrency
from servegate.runtime.postprocess import constraint_problem

MAX_TOKENS = 32
"""Tokens per probe answer: room for the probes' short answers to end."""
MIN_REQUESTS = 8
"""Requests per kind and phase at least (and at least twice the concurrency, so the server stays full)."""
PROBE_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 8}},
    "required": ["answer"],
    "additionalProperties": False,
}
"""The json_schema probe where the manifest declares no output_schema."""
PROBE_SPECS = {
    "json_object": ANY_JSON_OBJECT,
    "regex": "[0-9]{1,6}",
    "choice": json.dumps(["yes", "no", "maybe"]),
    "grammar": 'start: "(" /[0-9]{1,3}/ ("+" /[0-9]{1,3}/)? ")"',
}
"""The probe constraint of each other kind: short languages a model of any size ends within MAX_TOKENS."""


@dataclass(frozen=True)
class ConstraintPhase:
    """The answers of one kind's probe in one phase."""

    kind: str
    """The constraint kind probed."""
    concurrency: int
    """Requests in flight during the phase (1: alone)."""
    stream: bool
    """Whether the answers were streamed."""
    answers: int
    """Answers received (refusals included)."""
    ended: int
    """Answers their constraint ended (finish_reason stop): the ones judged."""
    broken: int
    """Ended answers that break the constraint, and answers refused as invalid_output."""


@dataclass(frozen=True)
class ConstraintsUnderLoad:
    """Every allowed kind's probe at concurrency 1 and at the declared concurrency, streamed and not."""

    target: str
    """Where the answers came from (servegate's server in process, or the remote directly)."""
    phases: tuple[ConstraintPhase, ...]
    """Four phases per kind."""
    first_broken: str | None
    """The first broken answer, as the check described it (None when none broke)."""


def probes(served: ServedModel) -> list[OutputConstraint]:
    """One probe constraint per kind the manifest allows; where requests bring none (request_constraints:
    false), the output_schema every answer is decoded under."""
    structured = served.postprocess.structured_output
    assert structured is not None
    schema = served.postprocess.output_schema or PROBE_SCHEMA
    compact = structured.whitespace == "compact"
    if not structured.request_constraints:
        return [OutputConstraint("json_schema", json.dumps(schema), "postprocess.output_schema", compact)]
    specs = {**PROBE_SPECS, "json_schema": json.dumps(schema)}
    return [OutputConstraint(kind, specs[kind], "probe", compact) for kind in structured.kinds]


def _judged(constraint: OutputConstraint, answer: Answer) -> tuple[bool, str | None]:
    """(ended, why it breaks the constraint or None) of one answer."""
    if answer.error == "invalid_output":
        return True, f"{constraint.kind}: the server refused its own answer as invalid_output"
    ended = answer.ok and bool(answer.finish_reasons) and answer.finish_reasons[-1] == "stop"
    if not ended:
        return False, None
    problem = constraint_problem(constraint, answer.text)
    return True, None if problem is None else f"{constraint.kind}: {problem} ({answer.text[:60]!r})"


async def _phase(
    ctx: GateContext, target: HttpTarget, constraint: OutputConstraint, level: int, stream: bool, prompts: list[str]
) -> tuple[ConstraintPhase, str | None]:
    """One kind's probe at one concurrency: the phase's counts, and its first broken answer."""
    window = asyncio.Semaphore(level)
    own = constraint.param == "probe"  # else the manifest's own schema, which the server applies unasked
    extra = {"structured_outputs": constraint.as_structured_outputs()} if own else None

    async def one(prompt: str) -> Answer:
        async with window:
            answer = await target.complete(prompt, MAX_TOKENS, stream=stream, extra=extra)
        ctx.progress.advance()
        return answer

    answers = list(await asyncio.gather(*(one(p) for p in prompts)))
    judged = [_judged(constraint, a) for a in answers]
    ended, broken = sum(e for e, _ in judged), sum(why is not None for _, why in judged)
    first = next((why for _, why in judged if why), None)
    return ConstraintPhase(constraint.kind, level, stream, len(answers), ended, broken), first


async def _measure(ctx: GateContext, served: ServedModel, prompts: list[str]) -> ConstraintsUnderLoad:
    concurrency, _ = load_concurrency(served)
    n = max(MIN_REQUESTS, 2 * concurrency)
    chosen = [prompts[k % len(prompts)] for k in range(n)]
    kinds = probes(served)
    phases: list[ConstraintPhase] = []
    first: str | None = None
    ctx.progress.start(f"contract: output constraints at 1 and {concurrency}", 4 * n * len(kinds))
    async with open_target(ctx, served) as target:
        for constraint in kinds:
            for level in (1, concurrency):
                for stream in (False, True):
                    phase, broken = await _phase(ctx, target, constraint, level, stream, chosen)
                    phases.append(phase)
                    first = first or broken
    return ConstraintsUnderLoad(target.label, tuple(phases), first)


def constraint_check(measured: ConstraintsUnderLoad) -> FieldCheck:
    """The field check of postprocess.structured_output: a problem when any answer broke its constraint, not
    verified when some kind's answers never ended."""
    requests = sum(p.answers for p in measured.phases)
    broken = sum(p.broken for p in measured.phases)
    ended: dict[str, int] = {}
    for phase in measured.phases:
        ended[phase.kind] = ended.get(phase.kind, 0) + phase.ended
    field = "postprocess.structured_output"
    if broken:
        where = sorted({f"{p.kind} at concurrency {p.concurrency}" for p in measured.phases if p.broken})
        first = measured.first_broken
        problem = f"{broken} answer(s) break their output constraint ({', '.join(where)}); first: {first}"
        return FieldCheck(field, "measured", f"{broken} of {requests} answers broken", problem, requests)
    silent = [kind for kind, count in ended.items() if count == 0]
    if silent:
        detail = f"no {', '.join(silent)} answer ended within {MAX_TOKENS} tokens, so none could be judged"
        return FieldCheck(field, "not verified", detail, None, requests)
    judged = sum(ended.values())
    detail = f"all {judged} ended answers satisfy their constraint ({len(ended)} kind(s), alone and under load)"
    return FieldCheck(field, "measured", detail, None, requests)


def check_constraints(ctx: GateContext, prompts: list[str]) -> tuple[FieldCheck | None, ConstraintsUnderLoad | None]:
    """The constraint check and its measurements; nothing when the manifest declares no structured output."""
    served = ctx.candidate
    if served.postprocess.structured_output is None:
        return None, None
    if served.postprocess.stop:
        why = "postprocess.stop can end an answer before its constraint does, so an ended answer proves nothing"
        return FieldCheck("postprocess.structured_output", "not verified", why), None
    measured = asyncio.run(_measure(ctx, served, prompts))
    return constraint_check(measured), measured
