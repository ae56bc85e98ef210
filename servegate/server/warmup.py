"""Warm-up with expected outputs: the manifest's runtime.warmup prompts must answer as declared before ready.

A deploy whose weights, tokenizer or quantization broke still loads and still answers; comparing a few
greedy outputs with what the manifest says they must be catches it before traffic arrives.
"""

from __future__ import annotations

import logging

from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.interface import Engine
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest, SamplingParams

log = logging.getLogger("servegate.server")


def _clip(text: str, limit: int = 80) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} chars)"


async def run_warmup(served: ServedModel, engine: Engine) -> list[str]:
    """Run every warm-up prompt greedily; one problem line per prompt that failed or differs from `expect`."""
    problems: list[str] = []
    prompts = served.runtime.warmup
    for index, item in enumerate(prompts, start=1):
        where = f"warm-up prompt {index} of {len(prompts)}"
        if served.preprocess.task == "embed":
            try:
                await engine.embed([item.prompt])
            except Exception as exc:  # any failure keeps the server not-ready, with the reason logged
                problems.append(f"{where}: embedding failed: {type(exc).__name__}: {exc}")
            continue
        request = GenerationRequest(
            id=f"warmup-{index}",
            prompt=item.prompt,
            params=SamplingParams(max_tokens=item.max_tokens, temperature=0.0, seed=served.runtime.seed),
        )
        result: FinishEvent | ErrorEvent | None = None
        try:
            async for event in engine.submit(request):
                if isinstance(event, FinishEvent | ErrorEvent):
                    result = event
        except Exception as exc:  # same: a crash in warm-up is a failed warm-up, not a crashed server
            problems.append(f"{where}: generation failed: {type(exc).__name__}: {exc}")
            continue
        if isinstance(result, ErrorEvent):
            problems.append(f"{where}: generation failed: {result.error.code}: {result.error.message}")
        elif result is None:
            problems.append(f"{where}: the engine ended without a result")
        elif item.expect is not None and result.text != item.expect:
            problems.append(f"{where}: expected {_clip(item.expect)}, got {_clip(result.text)}")
    for problem in problems:
        log.error("%s", problem)  # manifest text, not client text: safe to log
    if prompts and not problems:
        log.info("warm-up passed: %d prompt(s) gave their expected output", len(prompts))
    return problems
