"""`prompt_logprobs: k` (vLLM): beside the answer, every prompt token's log-probability and vocabulary rank, with
the k likeliest tokens at its position; in a completion choice's `prompt_logprobs`, in a chat completion's
top-level `prompt_logprobs`.

The prompt is scored by the engine's `score` in one prefill under the manifest's chat template, input limit and
truncation, so the tokens are those the model saw (the chat prompt as rendered). Each position (the first is
null: nothing precedes it) maps a token id, as a string, to {logprob, rank, decoded_token}: the prompt's own
token first, then the alternatives by likelihood, rank 1 first; k + 1 entries where the prompt's token is not
among the k. Choices of one prompt share its entries. An engine that cannot score prompts answers
`unsupported_parameter`.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from servegate.contracts.errors import ServingError
from servegate.contracts.request_models import ChatCompletionRequest, CompletionRequest
from servegate.runtime.types import ErrorEvent, GenerationRequest, PromptLogprobs, ScoreResult, token_id_name
from servegate.server.state import ServerState


def engine_tokenizer(state: ServerState) -> Any:
    """The manifest's tokenizer as the engine holds it (None where it has none)."""
    return state.engine.tokenizer


def check_prompt_logprobs(state: ServerState, param: str = "prompt_logprobs") -> None:
    """Refuse `param` where the engine cannot score prompts, or has no tokenizer to name their tokens with."""
    if not state.engine.scores_prompts or engine_tokenizer(state) is None:
        raise ServingError("unsupported_parameter", param=param, detail="this engine cannot score prompts")


async def score_prompts(state: ServerState, requests: list[GenerationRequest], top: int) -> list[ScoreResult]:
    """Each request's prompt scored with `top` alternatives per position (at least 1)."""
    asks = [replace(r, params=replace(r.params, top_logprobs=max(1, top))) for r in requests]
    return list(await asyncio.to_thread(state.engine.score, asks))


def first_error(scored: list[ScoreResult]) -> ErrorEvent | None:
    """The first prompt that could not be scored (None: all were)."""
    return next((r for r in scored if isinstance(r, ErrorEvent)), None)


def prompt_entries(prompt: PromptLogprobs, top: int, tokenizer: Any, as_ids: bool) -> list[dict[str, Any] | None]:
    """vLLM's prompt_logprobs of one scored prompt: per position, the token's own entry, then `top` alternatives."""

    def named(token: int) -> str:
        return token_id_name(token) if as_ids else tokenizer.decode([token])

    entries: list[dict[str, Any] | None] = [None]
    for i in range(1, len(prompt.token_ids)):
        token, value = int(prompt.token_ids[i]), prompt.logprobs[i]
        ranked = sorted((prompt.top[i] if i < len(prompt.top) else {}).items(), key=lambda kv: -kv[1])
        by_rank = {int(t): r for r, (t, _) in enumerate(ranked, start=1)}
        rank = prompt.ranks[i] if i < len(prompt.ranks) and prompt.ranks[i] is not None else by_rank.get(token)
        entry = {str(token): {"logprob": value, "rank": rank, "decoded_token": named(token)}}
        for r, (alternative, logprob) in enumerate(ranked[:top], start=1):
            entry.setdefault(str(alternative), {"logprob": logprob, "rank": r, "decoded_token": named(alternative)})
        entries.append(entry)
    return entries


async def with_prompt_logprobs(
    state: ServerState,
    parsed: CompletionRequest | ChatCompletionRequest,
    requests: list[GenerationRequest],
    answer: tuple[int, dict[str, Any], dict[str, str]],
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """A finished answer with its prompts' prompt_logprobs added (an error answer, or a prompt that cannot be
    scored, answers with that error)."""
    status, body, headers = answer
    top = parsed.prompt_logprobs
    if status != 200 or top is None:
        return answer
    scored = await score_prompts(state, requests[:: parsed.n], top)
    failed = first_error(scored)
    if failed is not None:
        return failed.error.status, failed.error.to_body(), {**failed.error.headers(), **headers}
    # first_error found none, so every item is a PromptLogprobs
    attach_prompt_logprobs(parsed, body, scored, engine_tokenizer(state))  # type: ignore[arg-type]
    return status, body, headers


def attach_prompt_logprobs(
    parsed: CompletionRequest | ChatCompletionRequest,
    body: dict[str, Any],
    scored: list[PromptLogprobs],
    tokenizer: Any,
) -> None:
    """Write each prompt's entries (`scored`: one per prompt, in order) into the answer's body, where the
    request asked for them."""
    top = parsed.prompt_logprobs
    if top is None:
        return
    entries = [prompt_entries(p, top, tokenizer, parsed.return_tokens_as_token_ids) for p in scored]
    if isinstance(parsed, ChatCompletionRequest):
        body["prompt_logprobs"] = entries[0]
    else:
        for choice in body["choices"]:
            choice["prompt_logprobs"] = entries[choice["index"] // parsed.n]
