"""What the contract gate measures where it cannot read it: the context a remote serves, and whether a seed
fixes a sampled answer. A field that can be neither read nor measured is named "not verified", never passed.

Context: a remote that reports no context length (servegate's /v1/models did not before it published
`max_model_len`; TGI's and llama.cpp's do not) gets one prompt at the declared context, sent as token ids
straight to the remote (servegate's own input limit would cut it first): `max_model_len - 1` prompt tokens
and 1 to generate. It holds when the remote answers 200 and its usage counts every prompt token; a refusal
(vLLM answers 400 to a prompt past its context) or a shorter count (a remote that truncates) is drift,
unless a remote cap on prompts could explain it (the manifest's own max_input_tokens is lower): then the
longest request this front sends (max_input_tokens + max_output_tokens) is tried; it failing is drift, it
passing leaves the declared context not verified.

Seed: the same seed must give the same sample, which shows only where samples vary. At temperature 1 the
zoo model gives the same text for most seeds (on "1+1=", 338 of 780 pairs of draws with different seeds
were identical), so a remote that ignores the seed passed. The probe samples at the API's highest
temperature, 2.0, on prompts the model is unsure of: of 1,770 pairs of draws with different seeds, 4
("you green key") and 5 ("probe: ") were identical (16 tokens, zoo:tiny-primary, 2026-12-02). Each prompt
is drawn twice with one seed and once with another: six requests (under an output schema, the first two
suite prompts instead: the zoo model's JSON answers vary in their digits and stay valid). Same-seed draws
that differ are a failure; when no two draws differ at all, a server that ignores the seed would look the
same, and the seed is not verified.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from servegate.contracts.manifest import ServedModel

SEED_PROMPTS = ("you green key", "probe: ")
"""Prompts on which zoo:tiny-primary's draws at temperature 2.0 differ (see the module docstring)."""
SEED_TEMPERATURE = 2.0
"""The highest temperature the API accepts: the draws that differ most."""
SEED_TOKENS = 16
SEEDS = (1234, 98765)
"""The repeated seed, then the other one."""
CONTEXT_FIELD = "runtime.max_model_len"
SEED_FIELD = "seed"


@dataclass(frozen=True)
class FieldCheck:
    """How one field the contract gate claims to check was checked, and what it found."""

    field: str
    """The field: `runtime.max_model_len` or `seed`."""
    how: str
    """`reported` (the remote says it), `measured` (a probe showed it) or `not verified`."""
    detail: str
    """What was seen, in words (for a `not verified` field: why it could not be measured)."""
    problem: str | None = None
    """The drift found, when the field does not hold."""
    requests: int = 0
    """Requests the check sent."""


Draw = Callable[[str, int], Awaitable[tuple[str | None, str]]]
"""(prompt, seed) -> (the sampled text, or None when refused; what the server answered, for the report)."""


def seed_prompts(served: ServedModel, suite_prompts: list[str]) -> tuple[str, ...]:
    """The prompts drawn: SEED_PROMPTS, or the first two suite prompts under an output schema (a free prompt at
    temperature 2.0 seldom gives valid JSON, and a draw refused as invalid_output shows no text)."""
    if served.postprocess.output_schema is not None and suite_prompts:
        return tuple(suite_prompts[:2])
    return SEED_PROMPTS


async def check_seed(draw: Draw, prompts: tuple[str, ...] = SEED_PROMPTS) -> FieldCheck:
    """Two draws with one seed and one with another, per probe prompt: the same seed must give the same text."""
    varied, refusals, sent = False, [], 0
    for prompt in prompts:
        texts = []
        for seed in (SEEDS[0], SEEDS[0], SEEDS[1]):
            text, answer = await draw(prompt, seed)
            sent += 1
            if text is None:
                refusals.append(answer)
                break
            texts.append(text)
        if len(texts) < 3:
            continue
        first, again, other = texts
        if first != again:
            problem = (
                f"the same seed gave different outputs: {first!r} then {again!r} for {prompt!r} at temperature "
                f"{SEED_TEMPERATURE} (the server does not honour the request's seed)"
            )
            return FieldCheck(SEED_FIELD, "measured", problem, problem=problem, requests=sent)
        varied = varied or other != first
    if varied:
        detail = (
            f"draws with different seeds differ at temperature {SEED_TEMPERATURE}, draws with the same seed are equal"
        )
        return FieldCheck(SEED_FIELD, "measured", detail, requests=sent)
    if refusals and len(refusals) == len(prompts):
        why = f"the sampled probe requests were refused ({refusals[0]})"
    else:
        why = (
            f"draws with different seeds never differed at temperature {SEED_TEMPERATURE}, so a server that "
            "ignores the seed would look the same"
        )
    return FieldCheck(SEED_FIELD, "not verified", why, requests=sent)


def seed_body(model: str, prompt: str, seed: int) -> dict[str, Any]:
    """The sampled completions request of one seed draw (tenant fields are the caller's)."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": SEED_TOKENS,
        "temperature": SEED_TEMPERATURE,
        "seed": seed,
    }


def context_reported(declared: int, reported: int) -> FieldCheck:
    """The context a remote reports (remote_drift fails one shorter than declared)."""
    return FieldCheck(CONTEXT_FIELD, "reported", f"the remote reports max_model_len {reported} (declared {declared})")


def filler_ids(tokenizer: Any, count: int) -> list[int]:
    """`count` ordinary token ids of the manifest's tokenizer (digits and spaces, repeated)."""
    ids = [int(t) for t in tokenizer("0 1 2 3 4 5 6 7 8 9 ", add_special_tokens=False)["input_ids"]]
    if not ids:
        raise ValueError("the tokenizer gives no ids for digits")
    return [ids[i % len(ids)] for i in range(count)]


async def measure_context(
    client: httpx.AsyncClient, base_url: str, model: str, served: ServedModel, tokenizer: Any
) -> FieldCheck:
    """A prompt at the declared context (declared - 1 tokens, 1 to generate) sent to the remote as token ids.

    A remote may cap prompts below its context (servegate's own server at its max_input_tokens, TGI at
    --max-input-tokens), and a refused or cut long prompt cannot tell that cap from a shorter context. So
    when the manifest's own input limit is lower, a second request sends the longest request this front
    ever sends (max_input_tokens of prompt, max_output_tokens to generate): refused or cut, the remote cannot
    serve the manifest (drift); answered whole, the declared context is not verified.
    """
    declared = served.runtime.max_model_len
    pre, post = served.preprocess, served.postprocess
    url = base_url.rstrip("/") + "/completions"
    whole = await _context_probe(client, url, model, tokenizer, declared - 1, 1, declared)
    if whole.problem is None or pre.max_input_tokens >= declared - 1:
        return whole
    longest = await _context_probe(
        client, url, model, tokenizer, pre.max_input_tokens, post.max_output_tokens, declared
    )
    if longest.how == "not verified" or longest.problem is not None:
        return FieldCheck(CONTEXT_FIELD, longest.how, longest.detail, longest.problem, requests=2)
    detail = (
        f"the remote {whole.detail}; it serves the longest request this front sends ({pre.max_input_tokens} prompt + "
        f"{post.max_output_tokens} output tokens), but whether it serves {declared} tokens is not known"
    )
    return FieldCheck(CONTEXT_FIELD, "not verified", detail, requests=2)


async def _context_probe(
    client: httpx.AsyncClient, url: str, model: str, tokenizer: Any, sent: int, generate: int, declared: int
) -> FieldCheck:
    """One greedy request of `sent` prompt tokens and `generate` to generate: kept whole, refused, or cut (the
    detail says what the remote did; the problem adds the field and the fix)."""
    body = {"model": model, "prompt": filler_ids(tokenizer, sent), "max_tokens": generate, "temperature": 0.0}
    what = f"a prompt of {sent} tokens with {generate} to generate (the declared {declared})"
    try:
        response = await client.post(url, json=body)
    except (httpx.HTTPError, OSError) as exc:
        return FieldCheck(CONTEXT_FIELD, "not verified", f"{what} got no answer ({type(exc).__name__})", requests=1)
    if response.status_code >= 500:
        detail = f"{what} got HTTP {response.status_code}, which says nothing of the context"
        return FieldCheck(CONTEXT_FIELD, "not verified", detail, requests=1)
    counted = _prompt_tokens(response) if response.status_code == 200 else None
    if response.status_code != 200:
        seen = f"refused {what}: HTTP {response.status_code} {_message(response)}"
    elif counted is None:
        detail = f"{what} was answered without usage.prompt_tokens, so whether all of it was kept is unknown"
        return FieldCheck(CONTEXT_FIELD, "not verified", detail, requests=1)
    elif counted != sent:
        seen = f"kept {counted} of the {sent} prompt tokens of {what}"
    else:
        return FieldCheck(CONTEXT_FIELD, "measured", f"{what} accepted whole", requests=1)
    problem = (
        f"runtime.max_model_len declares {declared} tokens, the remote {seen}: lower max_model_len or restart "
        "the remote with a longer context"
    )
    return FieldCheck(CONTEXT_FIELD, "measured", seen, problem=problem, requests=1)


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return response.text[:160]
    message = error.get("message") if isinstance(error, dict) else error
    return str(message or "")[:160]


def _prompt_tokens(response: httpx.Response) -> int | None:
    """usage.prompt_tokens of a plain answer, or of the last usage a streamed one carried."""
    usage: dict[str, Any] = {}
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            data = line[5:].strip() if line.startswith("data:") else ""
            if data and data != "[DONE]":
                try:
                    usage = json.loads(data).get("usage") or usage
                except (ValueError, AttributeError):
                    continue
    else:
        try:
            usage = response.json().get("usage") or {}
        except (ValueError, AttributeError):
            return None
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return int(value) if isinstance(value, int) else None
