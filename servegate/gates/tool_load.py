"""Forced tool calls alone and under load, for the contract gate: every call that comes back parses.

When postprocess.tools serves `required` or a named choice, each is probed with one probe function and the suites'
prompts, at concurrency 1 and at the declared concurrency (gates/load.py `load_concurrency`), streamed and not,
through servegate's server in process (in front of the remote where there is one: reading calls is servegate's
part). An answer that ended (finish_reason tool_calls or stop) must carry the calls its mode asks for, each of the
offered function, with arguments that satisfy its schema, checked on the answer as the client got it (jsonschema,
not the parser); a refusal as invalid_output is broken too. There is no margin: a parser or a mask holds on every
answer or it is broken. Answers cut short by max_tokens are counted, not judged. `auto` is not probed here:
whether a model calls at all is the model's choice, not the contract's.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from servegate.contracts.manifest import ServedModel
from servegate.gates.base import GateContext
from servegate.gates.constraint_load import MIN_REQUESTS
from servegate.gates.contract_measure import FieldCheck
from servegate.gates.http_target import Answer, HttpTarget, open_target
from servegate.gates.load import load_concurrency

MAX_TOKENS = 64
"""Tokens per probe answer at most (and at most the manifest's max_output_tokens): room for one short call."""
PROBE_PARAMETERS = {
    "type": "object",
    "properties": {"a": {"type": "string", "maxLength": 4}, "b": {"type": "boolean"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
"""The probe function's arguments: two, both required, so a call that loses one is seen."""
PROBE_TOOL = {
    "type": "function",
    "function": {"name": "note", "description": "Note it", "parameters": PROBE_PARAMETERS},
}
PROBE_CHOICES: dict[str, Any] = {"required": "required", "named": {"type": "function", "function": {"name": "note"}}}
"""The tool_choice of each probed mode."""
ENDED = {"required": "tool_calls", "named": "stop"}
"""The finish_reason of an answer whose call is complete, per mode (OpenAI's and vLLM's)."""


@dataclass(frozen=True)
class ToolPhase:
    """The answers of one mode's probe in one phase."""

    mode: str
    """The tool_choice mode probed (required, named)."""
    concurrency: int
    """Requests in flight during the phase (1: alone)."""
    stream: bool
    """Whether the answers were streamed."""
    answers: int
    """Answers received (refusals included)."""
    ended: int
    """Answers whose call was complete (the ones judged)."""
    broken: int
    """Ended answers whose calls do not parse or break the schema, and answers refused as invalid_output."""


@dataclass(frozen=True)
class ToolsUnderLoad:
    """Every forced mode's probe at concurrency 1 and at the declared concurrency, streamed and not."""

    target: str
    """Where the answers came from (servegate's server in process)."""
    phases: tuple[ToolPhase, ...]
    """Four phases per mode."""
    first_broken: str | None
    """The first broken answer, as the check described it (None when none broke)."""


def call_problem(mode: str, answer: Answer) -> str | None:
    """Why an ended answer's calls are not the ones its mode asks for (None: they are)."""
    if not answer.tool_calls:
        return f"{mode}: the answer ended ({answer.finish_reasons[-1]}) without a tool call ({answer.text[:60]!r})"
    if mode == "named" and len(answer.tool_calls) != 1:
        return f"named: {len(answer.tool_calls)} calls, not one"
    validator = jsonschema.Draft202012Validator(PROBE_PARAMETERS)
    for number, (name, arguments) in enumerate(answer.tool_calls, start=1):
        if name != "note":
            return f"{mode}: call {number} calls {name!r}, which was not offered"
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return f"{mode}: call {number}'s arguments are not JSON ({exc.msg}): {arguments[:60]!r}"
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is not None:
            return f"{mode}: call {number}'s arguments break the schema: {error.message} ({arguments[:60]!r})"
    return None


def _judged(mode: str, answer: Answer) -> tuple[bool, str | None]:
    """(ended, why its calls are broken or None) of one answer."""
    if answer.error == "invalid_output":
        return True, f"{mode}: the server refused its own answer as invalid_output"
    ended = answer.ok and bool(answer.finish_reasons) and answer.finish_reasons[-1] == ENDED[mode]
    return (True, call_problem(mode, answer)) if ended else (False, None)


async def _phase(
    ctx: GateContext, target: HttpTarget, mode: str, level: int, stream: bool, prompts: list[str], tokens: int
) -> tuple[ToolPhase, str | None]:
    window = asyncio.Semaphore(level)
    extra = {"tools": [PROBE_TOOL], "tool_choice": PROBE_CHOICES[mode], "parallel_tool_calls": False}

    async def one(prompt: str) -> Answer:
        async with window:
            answer = await target.chat([{"role": "user", "content": prompt}], tokens, stream=stream, extra=extra)
        ctx.progress.advance()
        return answer

    answers = list(await asyncio.gather(*(one(p) for p in prompts)))
    judged = [_judged(mode, a) for a in answers]
    ended, broken = sum(e for e, _ in judged), sum(why is not None for _, why in judged)
    first = next((why for _, why in judged if why), None)
    return ToolPhase(mode, level, stream, len(answers), ended, broken), first


def forced_modes(served: ServedModel) -> list[str]:
    """The forced tool_choice modes the manifest serves (the ones probed)."""
    tools = served.postprocess.tools
    return [m for m in ("required", "named") if tools is not None and m in tools.tool_choice]


async def _measure(ctx: GateContext, served: ServedModel, prompts: list[str]) -> ToolsUnderLoad:
    concurrency, _ = load_concurrency(served)
    n = max(MIN_REQUESTS, 2 * concurrency)
    chosen = [prompts[k % len(prompts)] for k in range(n)]
    modes = forced_modes(served)
    tokens = min(MAX_TOKENS, served.postprocess.max_output_tokens)
    phases: list[ToolPhase] = []
    first: str | None = None
    ctx.progress.start(f"contract: forced tool calls at 1 and {concurrency}", 4 * n * len(modes))
    async with open_target(ctx, served, front=True) as target:
        for mode in modes:
            for level in (1, concurrency):
                for stream in (False, True):
                    phase, broken = await _phase(ctx, target, mode, level, stream, chosen, tokens)
                    phases.append(phase)
                    first = first or broken
    return ToolsUnderLoad(target.label, tuple(phases), first)


def tool_check(measured: ToolsUnderLoad) -> FieldCheck:
    """The field check of postprocess.tools: a problem when any call broke, not verified when some mode's answers
    never ended."""
    requests = sum(p.answers for p in measured.phases)
    broken = sum(p.broken for p in measured.phases)
    ended: dict[str, int] = {}
    for phase in measured.phases:
        ended[phase.mode] = ended.get(phase.mode, 0) + phase.ended
    field = "postprocess.tools"
    if broken:
        where = sorted({f"{p.mode} at concurrency {p.concurrency}" for p in measured.phases if p.broken})
        problem = f"{broken} tool call answer(s) broken ({', '.join(where)}); first: {measured.first_broken}"
        return FieldCheck(field, "measured", f"{broken} of {requests} answers broken", problem, requests)
    silent = [mode for mode, count in ended.items() if count == 0]
    if silent:
        detail = f"no {', '.join(silent)} call was complete within the probe's tokens, so none could be judged"
        return FieldCheck(field, "not verified", detail, None, requests)
    modes = ", ".join(ended)
    detail = f"all {sum(ended.values())} complete calls parse and satisfy their schema ({modes}, alone and under load)"
    return FieldCheck(field, "measured", detail, None, requests)


def check_tools(ctx: GateContext, prompts: list[str]) -> tuple[FieldCheck | None, ToolsUnderLoad | None]:
    """The tool-call check and its measurements; nothing when the manifest serves no tools, not verified when it
    forces none."""
    served = ctx.candidate
    if served.postprocess.tools is None:
        return None, None
    if not forced_modes(served):
        why = "only none and auto are served: whether the model calls is its own choice, so no call is forced"
        return FieldCheck("postprocess.tools", "not verified", why), None
    if served.postprocess.stop:
        why = "postprocess.stop can end an answer inside its call, so an ended answer proves nothing"
        return FieldCheck("postprocess.tools", "not verified", why), None
    measured = asyncio.run(_measure(ctx, served, prompts))
    return tool_check(measured), measured
