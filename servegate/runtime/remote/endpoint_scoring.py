"""Prompt-token log-probabilities from a remote: legacy completions `echo: true` with `logprobs`.

The endpoint engine encodes the prompt as the manifest says (chat template, input limit, truncation
policy), sends the token ids with `echo: true, logprobs: 1, max_tokens: 1, temperature: 0` (vLLM answers
the prompt's tokens with their log-probabilities, then the one generated token, which is dropped), and
waits in the same bounded queue as generation requests. A remote that refuses echo, or answers without
per-token log-probabilities of the prompt, gets `unsupported_parameter` (param `echo`) naming it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import httpx

from servegate.contracts.errors import ServingError
from servegate.runtime.contract_layer import admit
from servegate.runtime.failure_policy.outcomes import deadline_exceeded, unavailable
from servegate.runtime.remote.completions_stream import error_from_status
from servegate.runtime.remote.own_loop import run_on_own_loop
from servegate.runtime.types import ErrorEvent, GenerationRequest, PromptLogprobs, ScoreResult


def cannot_score(base_url: str, why: str) -> ServingError:
    """The catalogued error for a remote that does not return prompt log-probabilities."""
    return ServingError(
        "unsupported_parameter",
        param="echo",
        detail=f"the endpoint {base_url} returns no prompt log-probabilities (echo with logprobs): {why}",
    )


def read_echo(
    base_url: str, choice: dict[str, Any], n: int
) -> tuple[list[float | None], list[bool], list[dict[int, float]], list[int | None]]:
    """The first `n` (prompt) token log-probabilities of an echoed choice, whether each was the top token, and
    the alternatives by token id and each token's rank where the remote gives them (vLLM's prompt_logprobs)."""
    logprobs = choice.get("logprobs") or {}
    values = logprobs.get("token_logprobs") or []
    if len(values) < n or any(v is None for v in values[1:n]):
        raise cannot_score(base_url, f"the answer carries {len(values)} token log-probabilities for {n} prompt tokens")
    prompt = [None, *(float(v) for v in values[1:n])]
    ranked = choice.get("prompt_logprobs")  # vLLM: per position {token id: {logprob, rank}}, the prompt's own first
    top: list[dict[int, float]] = []
    ranks: list[int | None] = []
    if isinstance(ranked, list) and len(ranked) >= n:
        greedy = [True] + [_top_by_rank(entry) for entry in ranked[1:n]]
        top = [{}] + [_by_id(entry) for entry in ranked[1:n]]
        ranks = [None, *(_own_rank(entry) for entry in ranked[1:n])]
    else:
        tops = logprobs.get("top_logprobs") or []
        greedy = [True] + [_top_by_value(tops[i] if i < len(tops) else None, prompt[i]) for i in range(1, n)]
    return prompt, greedy, top, ranks


def _own_rank(entry: Any) -> int | None:
    """The rank of the prompt token of one vLLM prompt_logprobs entry (its first key), None where not given."""
    first = next(iter(entry.values()), None) if isinstance(entry, dict) else None
    rank = first.get("rank") if isinstance(first, dict) else None
    return rank if isinstance(rank, int) else None


def _by_id(entry: Any) -> dict[int, float]:
    """{token id: log-probability} of one vLLM prompt_logprobs entry."""
    if not isinstance(entry, dict):
        return {}
    return {int(k): float(v["logprob"]) for k, v in entry.items() if isinstance(v, dict) and "logprob" in v}


def _top_by_rank(entry: Any) -> bool:
    """Whether the prompt token of one vLLM prompt_logprobs entry had rank 1 (its first key is the token)."""
    if not isinstance(entry, dict) or not entry:
        return False
    first = next(iter(entry.values()))
    return isinstance(first, dict) and first.get("rank") == 1


def _top_by_value(top: Any, value: float | None) -> bool:
    """Whether the token's log-probability is the best among the alternatives returned with it."""
    if not isinstance(top, dict) or not top or value is None:
        return False
    return value >= max(float(v) for v in top.values()) - 1e-6


async def _score_one(engine: Any, client: httpx.AsyncClient, request: GenerationRequest) -> ScoreResult:
    try:
        admitted = admit(engine.served, engine.contract.preprocessor, request)
        await engine.admission.acquire(admitted.deadline)
    except ServingError as error:
        return ErrorEvent(request.id, error)
    except (TimeoutError, asyncio.TimeoutError):
        return ErrorEvent(request.id, deadline_exceeded(admitted.timeout_s))
    body = {
        "model": engine.model,
        "prompt": admitted.token_ids,
        "echo": True,
        "logprobs": max(1, request.params.top_logprobs),
        "max_tokens": 1,
        "temperature": 0.0,
    }
    try:
        remaining = max(0.0, admitted.deadline - time.monotonic())
        resp = await asyncio.wait_for(client.post(engine.base_url + "/completions", json=body), timeout=remaining)
        if resp.status_code != 200:
            refusal = error_from_status(resp.status_code, resp.text)
            if refusal.code in ("invalid_request", "unsupported_parameter", "unknown_parameter"):
                refusal = cannot_score(engine.base_url, refusal.message)
            return ErrorEvent(request.id, refusal)
        try:
            choice = (resp.json().get("choices") or [{}])[0]
        except (ValueError, AttributeError, TypeError):
            raise cannot_score(engine.base_url, "the answer is not one completions JSON object") from None
        logprobs, greedy, top, ranks = read_echo(engine.base_url, choice, len(admitted.token_ids))
        ids = tuple(admitted.token_ids)
        return PromptLogprobs(
            request.id, ids, tuple(logprobs), tuple(greedy), admitted.truncated_tokens, tuple(top), tuple(ranks)
        )
    except ServingError as error:
        return ErrorEvent(request.id, error)
    except (TimeoutError, asyncio.TimeoutError):
        return ErrorEvent(request.id, deadline_exceeded(admitted.timeout_s))
    except (httpx.HTTPError, OSError, ValueError) as exc:
        return ErrorEvent(request.id, unavailable(f"cannot reach {engine.base_url}: {type(exc).__name__}"))
    finally:
        engine.admission.release()


def score_on_remote(engine: Any, requests: Sequence[GenerationRequest], window: int) -> list[ScoreResult]:
    """Score every request on the remote of `engine` (an EndpointEngine), `window` at once; results in order."""

    async def all_of() -> list[ScoreResult]:
        gate = asyncio.Semaphore(window)
        given = engine.given_client  # a test's transport
        client = given or httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))

        async def one(request: GenerationRequest) -> ScoreResult:
            async with gate:
                return await _score_one(engine, client, request)

        try:
            return list(await asyncio.gather(*(one(r) for r in requests)))
        finally:
            if client is not given:
                await client.aclose()

    return run_on_own_loop(all_of)
