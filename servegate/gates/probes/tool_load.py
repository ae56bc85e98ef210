"""Forced tool calls alone and under load, for the contract gate: every call that comes back parses.

When postprocess.tools serves `required` or a named choice, each is probed with one probe function and the suites'
prompts, at concurrency 1 and at the declared concurrency (`http_target.load_concurrency`), streamed and not,
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
from typing import Any

import jsonschema

from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.probes import ProbesUnderLoad
from servegate.gates.base import GateContext
from servegate.gates.probes.contract_measure import FieldCheck
from servegate.gates.probes.http_target import Answer, HttpTarget, open_target
from servegate.gates.probes.probe_phases import phases_check, run_phases

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


def forced_modes(served: ServedModel) -> list[str]:
    """The forced tool_choice modes the manifest serves (the ones probed)."""
    tools = served.postprocess.tools
    return [m for m in ("required", "named") if tools is not None and m in tools.tool_choice]


async def _measure(ctx: GateContext, served: ServedModel, prompts: list[str]) -> ProbesUnderLoad:
    tokens = min(MAX_TOKENS, served.postprocess.max_output_tokens)

    async def send(target: HttpTarget, mode: str, prompt: str, stream: bool) -> Answer:
        extra = {"tools": [PROBE_TOOL], "tool_choice": PROBE_CHOICES[mode], "parallel_tool_calls": False}
        return await target.chat([{"role": "user", "content": prompt}], tokens, stream=stream, extra=extra)

    async with open_target(ctx, served, front=True) as target:
        return await run_phases(ctx, target, forced_modes(served), prompts, send, _judged, "forced tool calls")


def tool_check(measured: ProbesUnderLoad) -> FieldCheck:
    """The field check of postprocess.tools: a problem when any call broke, not verified when some mode's calls
    never completed."""
    return phases_check(
        "postprocess.tools",
        measured,
        broken_as="carry a tool call that does not parse or breaks its schema",
        silent_as="completed its call within the probe's tokens, so none could be judged",
        held_as="carry calls that parse and satisfy their schema",
    )


def check_tools(ctx: GateContext, prompts: list[str]) -> tuple[FieldCheck | None, ProbesUnderLoad | None]:
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
