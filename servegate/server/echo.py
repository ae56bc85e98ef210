"""`echo: true` on /v1/completions: the prompt answered before the completion, with its log-probabilities.

Legacy OpenAI and vLLM semantics, which lm-eval's `local-completions` relies on for log-likelihood tasks:
each choice's text starts with the prompt; with `logprobs`, `tokens` / `token_logprobs` / `top_logprobs`
cover the prompt's tokens (the first has no log-probability: null) and then the generated ones. With
`max_tokens: 0` nothing is generated. The prompt is scored by the engine's `score` (one prefill, under
the manifest's template, input limit and truncation: the tokens echoed are the tokens the model saw).
An engine that cannot score prompts answers `unsupported_parameter` for `echo`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servegate.contracts.errors import ServingError
from servegate.contracts.request_models import CompletionRequest
from servegate.runtime.types import FinishEvent, GenerationRequest, PromptLogprobs, Usage
from servegate.server.bodies import BodyBuilder, completion_logprobs, finish_reason, total_usage, usage_body
from servegate.server.generation import EngineRun, cache_state, run_all, token_strings
from servegate.server.prompt_logprobs import (
    attach_prompt_logprobs,
    check_prompt_logprobs,
    engine_tokenizer,
    first_error,
    score_prompts,
)
from servegate.server.state import ServerState


def check_echo(state: ServerState, parsed: CompletionRequest, stream: bool, is_async: bool) -> None:
    """Refuse what echo cannot be combined with here (streams, async jobs, an engine that cannot score)."""
    if stream or is_async:
        what = "stream: true" if stream else "Prefer: respond-async"
        raise ServingError("invalid_request", param="echo", detail=f"echo: true cannot be combined with {what}")
    check_prompt_logprobs(state, "echo")


async def echo_completion(
    state: ServerState, parsed: CompletionRequest, requests: list[GenerationRequest], builder: BodyBuilder
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Score every choice's prompt, generate its completion when max_tokens > 0, and join the two per choice."""
    headers = {"X-Request-Id": builder.id}
    # one prefill serves the echoed logprobs and prompt_logprobs alike: scored with the more alternatives of the two
    scored = await score_prompts(state, requests, max(parsed.logprobs or 0, parsed.prompt_logprobs or 0))
    failed = first_error(scored)
    if failed is not None:
        return failed.error.status, failed.error.to_body(), {**failed.error.headers(), **headers}
    finishes: list[FinishEvent | None] = [None] * len(requests)
    if parsed.max_tokens > 0:
        runs = [EngineRun(state, request) for request in requests]
        try:
            done = await run_all(runs)
        except ServingError as error:
            return error.status, error.to_body(), {**error.headers(), **headers}
        for run, event in zip(runs, done, strict=True):
            run.record("completions", event)
        finishes = list(done)
        builder.cache = cache_state(state, [f.cached for f in done])
        if builder.cache is not None:
            headers["X-Servegate-Cache"] = builder.cache
        pairs = zip(runs, done, strict=True)
        generated = [token_strings(state, run, f) if f.logprobs is not None else [] for run, f in pairs]
    else:
        generated = [[] for _ in requests]
    tokenizer = engine_tokenizer(state)
    choices, usages = [], []
    for index, (request, prompt, finish, tokens) in enumerate(zip(requests, scored, finishes, generated, strict=True)):
        assert isinstance(prompt, PromptLogprobs)
        choice, usage = _choice(index, request, prompt, finish, tokens, tokenizer, parsed.logprobs)
        if builder.token_ids:  # the generated tokens only, as vLLM answers return_token_ids with echo
            choice["token_ids"] = builder.ids(finish.token_ids if finish is not None else ())
        choices.append(choice)
        usages.append(usage)
    body = builder.completion([])
    body["choices"] = choices
    body["usage"] = usage_body(total_usage(usages, builder.n)).model_dump(mode="json")
    # first_error found none, so every item is a PromptLogprobs
    attach_prompt_logprobs(parsed, body, scored[:: parsed.n], tokenizer)  # type: ignore[arg-type]
    return 200, body, headers


def _choice(
    index: int,
    request: GenerationRequest,
    prompt: PromptLogprobs,
    finish: FinishEvent | None,
    generated: Sequence[str],
    tokenizer: Any,
    logprobs: int | None,
) -> tuple[dict[str, Any], Usage]:
    """One echoed choice (prompt text, then the completion's) and its usage."""
    if request.prompt is not None and not prompt.truncated_tokens:
        prompt_text = request.prompt  # the client's own text, as vLLM echoes a text prompt
    else:
        prompt_text = tokenizer.decode(list(prompt.token_ids), skip_special_tokens=False)
    text = prompt_text + (finish.text if finish is not None else "")
    body: dict[str, Any] = {
        "index": index,
        "text": text,
        "finish_reason": finish_reason(finish) if finish is not None else "length",
        "logprobs": None,
    }
    if logprobs is not None:
        names = [tokenizer.decode([int(t)]) for t in prompt.token_ids]
        tops: list[dict[str, float] | None] = [None] + [
            {tokenizer.decode([int(t)]): v for t, v in list(top.items())[: max(1, logprobs)]} for top in prompt.top[1:]
        ]
        values: list[float | None] = list(prompt.logprobs)
        if finish is not None and finish.logprobs is not None:
            tail = completion_logprobs(finish, generated) or {}
            names += list(tail.get("tokens") or [])
            values += list(tail.get("token_logprobs") or [])
            tops += list(tail.get("top_logprobs") or [None] * len(tail.get("tokens") or []))
        offsets, at = [], 0
        for name in names:
            offsets.append(at)
            at += len(name)
        body["logprobs"] = {"tokens": names, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
    completion = finish.usage.completion_tokens if finish is not None else 0
    return body, Usage(len(prompt.token_ids), completion, prompt.truncated_tokens)
