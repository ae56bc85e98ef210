"""Structured output under concurrency, for the contract gate: validity and answer size at 1 and at load.

Engines have been seen to emit valid JSON alone and broken JSON at concurrency 8-32, or an answer of
hundreds of kilobytes of whitespace with HTTP 200. When `postprocess.output_schema` (or
`postprocess.max_output_bytes`) is declared, the same prompts are sent at concurrency 1 and at the declared
concurrency (`http_target.load_concurrency`), streamed and not, over the same HTTP target as the load
gate (each prompt once alone: probe_phases.phase_prompts). The contract fails when validity under
load falls more than the json_schema_valid margin below validity at concurrency 1, or when any answer is
longer than `postprocess.max_output_bytes`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema

from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.probes import StructuredPhase, StructuredUnderLoad
from servegate.gates.base import GateContext
from servegate.gates.probes.http_target import Answer, load_concurrency, open_target
from servegate.gates.probes.probe_phases import phase_prompts
from servegate.gates.quality.comparison import margin_for

MIN_REQUESTS = 16
"""Requests per phase at least (and at least twice the concurrency, so the server stays full)."""


def _prompts(ctx: GateContext) -> list[tuple[str, int]]:
    """(prompt, max_tokens) of the suites that score json_schema_valid, else of every generation suite."""
    suites = [d for d in ctx.suites() if d.suite.lm_eval is None]
    chosen = [d for d in suites if "json_schema_valid" in d.suite.metrics] or suites
    return [(item.prompt, d.suite.max_tokens) for d in chosen for item in d.items]


def _valid(answer: Answer, validator: Any) -> bool:
    if not answer.ok:
        return False
    try:
        value = json.loads(answer.text)
    except ValueError:
        return False
    return bool(validator.is_valid(value))


def _phase(served: ServedModel, concurrency: int, stream: bool, answers: list[Answer]) -> StructuredPhase:
    schema = served.postprocess.output_schema
    limit = served.postprocess.max_output_bytes
    sizes = [a.bytes for a in answers]
    valid = None
    if schema is not None:
        validator = jsonschema.Draft202012Validator(schema)
        valid = sum(_valid(a, validator) for a in answers)
    return StructuredPhase(
        concurrency=concurrency,
        stream=stream,
        answers=len(answers),
        valid=valid,
        validity=None if valid is None else round(valid / len(answers), 6),
        bytes_max=max(sizes, default=0),
        bytes_mean=round(sum(sizes) / len(sizes), 1) if sizes else 0.0,
        over_limit=sum(limit is not None and size > limit for size in sizes),
    )


async def _measure(ctx: GateContext, served: ServedModel, prompts: list[tuple[str, int]]) -> StructuredUnderLoad:
    concurrency, _ = load_concurrency(served)
    plan = phase_prompts(prompts, concurrency, max(MIN_REQUESTS, 2 * concurrency))
    phases = []
    total = 2 * sum(len(chosen) for chosen in plan.values())
    ctx.progress.start(f"contract: structured output at 1 and {concurrency}", total)
    async with open_target(ctx, served) as target:
        for level, chosen in plan.items():
            for stream in (False, True):
                window = asyncio.Semaphore(level)

                async def one(prompt: str, max_tokens: int, window: asyncio.Semaphore = window,
                              stream: bool = stream) -> Answer:  # fmt: skip
                    async with window:
                        answer = await target.complete(prompt, max_tokens, stream=stream)
                    ctx.progress.advance()
                    return answer

                answers = list(await asyncio.gather(*(one(p, m) for p, m in chosen)))
                phases.append(_phase(served, level, stream, answers))
    return StructuredUnderLoad(
        target=target.label,
        margin=margin_for(served, "json_schema_valid"),
        max_output_bytes=served.postprocess.max_output_bytes,
        phases=tuple(phases),
    )


def structured_problems(measured: StructuredUnderLoad) -> list[str]:
    """What breaks the contract: validity under load below validity alone by more than the margin, oversized answers."""
    problems = []
    alone = {p.stream: p for p in measured.phases if p.concurrency == 1}
    for phase in measured.phases:
        kind = "streamed" if phase.stream else "non-streamed"
        base = alone.get(phase.stream)
        if phase.concurrency > 1 and base is not None and phase.validity is not None and base.validity is not None:
            if phase.validity < base.validity - measured.margin:
                problems.append(
                    f"structured output breaks under load: {kind} validity {phase.validity:.0%} at concurrency "
                    f"{phase.concurrency} against {base.validity:.0%} at 1 (margin {measured.margin:g})"
                )
        if phase.over_limit:
            problems.append(
                f"{phase.over_limit} {kind} answer(s) at concurrency {phase.concurrency} over "
                f"postprocess.max_output_bytes {measured.max_output_bytes} (largest {phase.bytes_max} bytes)"
            )
    return problems


def check_structured(ctx: GateContext) -> tuple[list[str], StructuredUnderLoad | None]:
    """The problems and measurements of structured output under concurrency; nothing when none is declared."""
    served = ctx.candidate
    post = served.postprocess
    if post.output_schema is None and post.max_output_bytes is None:
        return [], None
    prompts = _prompts(ctx)
    if not prompts:
        return [], None
    if not served.runtime.remote:  # repeats must reach the engine, not the response cache
        data = post.model_dump(mode="python")
        data["response_cache"] = {**data["response_cache"], "enabled": False}
        served = served.with_changes(postprocess=data)
    measured = asyncio.run(_measure(ctx, served, prompts))
    return structured_problems(measured), measured
