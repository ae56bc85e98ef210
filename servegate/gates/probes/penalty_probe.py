"""Penalties and logit_bias, for the contract gate: each changes the greedy choice as its formula says.

A server that drops `logit_bias`, `presence_penalty` or `frequency_penalty` (a gateway that forwards only
what it knows, a backend that ignores them) still answers 200 with fluent text, so only the tokens show it.
Log-probabilities are those of the raw distribution, before any of them (vLLM's default and servegate's), so
the client can predict every greedy step: among a step's top alternatives (named `token_id:<id>`), the chosen
token must be the one with the highest

    raw log-probability - presence_penalty * [already generated] - frequency_penalty * (times generated) + bias

wherever that maximum is certain: above what any token outside the alternatives could reach, and clear of
the runner-up by TOLERANCE (a near-tie is not judged). The probes, per prompt of the suites: a bias that lifts
the first step's runner-up past the likeliest token by one nat, a presence penalty and a frequency penalty.
A step whose choice breaks the formula fails the gate; a probe whose penalty never changed a choice is not
verified (a warning), since it showed nothing. repetition_penalty divides raw logits, which log-probabilities
do not give, so it is not probed here.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from servegate.contracts.manifest import ServedModel
from servegate.gates.base import GateContext
from servegate.gates.probes.contract_measure import FieldCheck
from servegate.gates.probes.http_target import Answer, open_target
from servegate.runtime.types import token_id_of

FIELD = "presence_penalty, frequency_penalty, logit_bias"
PROMPTS = 6
"""Prompts of the suites probed (each: one plain answer and three probes)."""
MAX_TOKENS = 16
TOP = 5
"""Alternatives per step (the most /v1/completions offers)."""
TOLERANCE = 0.05
"""Nats by which a predicted choice must clear the runner-up (and what tokens outside the alternatives could
reach) to be judged: fp32 sums differ by far less."""
PENALTIES = {"presence_penalty": {"presence_penalty": 2.0}, "frequency_penalty": {"frequency_penalty": 2.0}}


@dataclass(frozen=True)
class Judged:
    """What one answer's steps showed."""

    judged: int
    """Steps whose choice was certain under the formula."""
    changed: int
    """Judged steps where the formula picks another token than the raw maximum (the field did something)."""
    broken: str | None
    """The first step that breaks the formula, in words (None: none)."""


def _ids(answer: Answer) -> tuple[list[int], list[dict[int, float]]] | None:
    """The chosen ids and each step's alternatives by id (None: the server did not name tokens by id)."""
    chosen = [token_id_of(name) for name in answer.logprob_tokens]
    tops = [{token_id_of(k): v for k, v in top.items()} for top in answer.top_logprobs]
    if not chosen or None in chosen or len(tops) != len(chosen) or any(None in top for top in tops):
        return None
    return chosen, tops  # type: ignore[return-value]  # no None among the ids: checked above


def judge(answer: Answer, presence: float, frequency: float, bias: dict[int, float]) -> Judged | None:
    """Each certain step of a greedy answer against the formula (None: no token ids to judge by)."""
    named = _ids(answer)
    if named is None:
        return None
    chosen, tops = named
    seen: Counter[int] = Counter()
    judged = changed = 0
    for step, (token, top) in enumerate(zip(chosen, tops, strict=True), start=1):
        score = {t: lp - presence * (seen[t] > 0) - frequency * seen[t] + bias.get(t, 0.0) for t, lp in top.items()}
        ranked = sorted(score.items(), key=lambda kv: -kv[1])
        outside = max((b for t, b in bias.items() if t not in top), default=0.0)
        reach = min(top.values()) + max(0.0, outside)
        certain = ranked[0][1] - reach > TOLERANCE and (len(ranked) < 2 or ranked[0][1] - ranked[1][1] > TOLERANCE)
        if certain:
            judged += 1
            raw_best = max(top, key=top.__getitem__)
            changed += ranked[0][0] != raw_best
            if token != ranked[0][0]:
                why = f"step {step} chose token {token}, the formula's choice is {ranked[0][0]}"
                return Judged(judged, changed, why)
        seen[token] += 1
    return Judged(judged, changed, None)


def _bias_for(plain: Answer) -> dict[int, float] | None:
    """A bias lifting the first step's runner-up one nat past the likeliest token (None: no runner-up)."""
    named = _ids(plain)
    if named is None or not named[1] or len(named[1][0]) < 2:
        return None
    (best, lp1), (second, lp2) = sorted(named[1][0].items(), key=lambda kv: -kv[1])[:2]
    return {second: min(100.0, lp1 - lp2 + 1.0)}


async def _measure(ctx: GateContext, served: ServedModel, prompts: list[str]) -> dict[str, list[Judged | None]]:
    base = {"logprobs": TOP, "return_tokens_as_token_ids": True, "ignore_eos": True}  # steps enough to repeat
    found: dict[str, list[Judged | None]] = {"logit_bias": [], **{name: [] for name in PENALTIES}}
    ctx.progress.start("contract: penalties and logit_bias", 4 * len(prompts))
    async with open_target(ctx, served) as target:
        for prompt in prompts:
            plain = await target.complete(prompt, MAX_TOKENS, stream=False, extra=base)
            ctx.progress.advance()
            bias = _bias_for(plain) if plain.ok else None
            if bias is not None:
                extra = {**base, "logit_bias": {str(t): b for t, b in bias.items()}}
                biased = await target.complete(prompt, MAX_TOKENS, stream=False, extra=extra)
                found["logit_bias"].append(judge(biased, 0.0, 0.0, bias) if biased.ok else None)
            ctx.progress.advance()
            for name, fields in PENALTIES.items():
                answer = await target.complete(prompt, MAX_TOKENS, stream=False, extra={**base, **fields})
                ctx.progress.advance()
                presence, frequency = fields.get("presence_penalty", 0.0), fields.get("frequency_penalty", 0.0)
                found[name].append(judge(answer, presence, frequency, {}) if answer.ok else None)
    return found


def penalty_check(found: dict[str, list[Judged | None]], requests: int) -> FieldCheck:
    """The field check: a problem when a step breaks its formula, not verified where a probe showed nothing."""
    broken = [(name, j.broken) for name, js in found.items() for j in js if j is not None and j.broken]
    if broken:
        name, why = broken[0]
        problem = f"{name} is not applied as its formula says ({len(broken)} answer(s)); first: {name}: {why}"
        return FieldCheck(FIELD, "measured", f"{len(broken)} answer(s) break the formula", problem, requests)
    silent = [name for name, js in found.items() if not any(j is not None and j.changed for j in js)]
    judged = sum(j.judged for js in found.values() for j in js if j is not None)
    if silent:
        detail = f"{', '.join(silent)} changed no greedy choice that could be judged ({judged} steps judged)"
        return FieldCheck(FIELD, "not verified", detail, None, requests)
    changed = sum(j.changed for js in found.values() for j in js if j is not None)
    detail = f"all {judged} judged steps follow the formula; the fields changed {changed} choice(s)"
    return FieldCheck(FIELD, "measured", detail, None, requests)


def check_penalties(ctx: GateContext, prompts: list[str]) -> FieldCheck | None:
    """The penalty check (None where it does not apply: no logprobs offered, or embeddings)."""
    served = ctx.candidate
    if served.preprocess.task != "generate" or not served.postprocess.logprobs:
        return None
    chosen = prompts[:PROMPTS]
    found = asyncio.run(_measure(ctx, served, chosen))
    if all(j is None for js in found.values() for j in js):
        why = "the server named no token by id (return_tokens_as_token_ids), so no step could be judged"
        return FieldCheck(FIELD, "not verified", why, None, 4 * len(chosen))
    return penalty_check(found, 4 * len(chosen))
