"""Output constraints alone and under load, for the contract gate: every answer its constraint ended satisfies it.

When `postprocess.structured_output` is declared, each kind it allows gets a probe constraint (the manifest's
output_schema for json_schema, where declared), sent with the suites' prompts at concurrency 1 and at the
declared concurrency (`http_target.load_concurrency`), streamed and not, over the same HTTP target as the load
gate: servegate's server in process, or the remote directly (which shows whether the remote honours
`structured_outputs` at all). An answer that ends (finish_reason stop) and breaks its constraint, checked by
other code than the mask (runtime/postprocess.constraint_problem), or that the server refuses as
invalid_output, fails the gate: a mask holds on every answer or it is broken, so there is no margin. Answers cut
short by max_tokens are counted, not judged; a kind none of whose answers ended is named as not verified.
"""

from __future__ import annotations

import asyncio
import json

from servegate.contracts.constraint_fields import ANY_JSON_OBJECT, OutputConstraint
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.probes import ProbesUnderLoad
from servegate.gates.base import GateContext
from servegate.gates.probes.contract_measure import FieldCheck
from servegate.gates.probes.http_target import Answer, HttpTarget, open_target
from servegate.gates.probes.probe_phases import phases_check, run_phases
from servegate.runtime.postprocess import constraint_problem

MAX_TOKENS = 32
"""Tokens per probe answer: room for the probes' short answers to end."""
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


async def _measure(ctx: GateContext, served: ServedModel, prompts: list[str]) -> ProbesUnderLoad:
    kinds: dict[str, OutputConstraint] = {constraint.kind: constraint for constraint in probes(served)}

    async def send(target: HttpTarget, kind: str, prompt: str, stream: bool) -> Answer:
        constraint = kinds[kind]
        own = constraint.param == "probe"  # else the manifest's own schema, which the server applies unasked
        extra = {"structured_outputs": constraint.as_structured_outputs()} if own else None
        return await target.complete(prompt, MAX_TOKENS, stream=stream, extra=extra)

    async with open_target(ctx, served) as target:
        return await run_phases(
            ctx, target, list(kinds), prompts, send, lambda kind, a: _judged(kinds[kind], a), "output constraints"
        )


def constraint_check(measured: ProbesUnderLoad) -> FieldCheck:
    """The field check of postprocess.structured_output: a problem when any answer broke its constraint, not
    verified when some kind's answers never ended."""
    return phases_check(
        "postprocess.structured_output",
        measured,
        broken_as="break their output constraint",
        silent_as=f"ended within {MAX_TOKENS} tokens, so none could be judged",
        held_as="satisfy their constraint",
    )


def check_constraints(ctx: GateContext, prompts: list[str]) -> tuple[FieldCheck | None, ProbesUnderLoad | None]:
    """The constraint check and its measurements; nothing when the manifest declares no structured output."""
    served = ctx.candidate
    if served.postprocess.structured_output is None:
        return None, None
    if served.postprocess.stop:
        why = "postprocess.stop can end an answer before its constraint does, so an ended answer proves nothing"
        return FieldCheck("postprocess.structured_output", "not verified", why), None
    measured = asyncio.run(_measure(ctx, served, prompts))
    return constraint_check(measured), measured
