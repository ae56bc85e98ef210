"""What a remote's streamed completions mean: the request it gets, the chunks it sends back, the final result.

Plain functions over plain data (no client, no event loop), so the endpoint engine stays the part that
waits, and each translation can be read and tested on its own.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Literal

from servegate.contracts.errors import CATALOGUE, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.contract_layer import AdmittedRequest
from servegate.runtime.postprocess import OutputValidator, cut_at_stop, output_problem
from servegate.runtime.remote.token_source import TokenReader, answer_tokens
from servegate.runtime.types import ErrorEvent, FinishEvent, SamplingParams, TokenEvent, Usage, token_id_of


def error_from_status(status: int, body: str) -> ServingError:
    """A catalogued error for a remote's non-200 answer."""
    code, message = None, body[:500]
    try:
        err = json.loads(body).get("error", {})
        if isinstance(err, dict):
            code, message = err.get("code"), str(err.get("message") or message)
    except (json.JSONDecodeError, AttributeError):
        pass
    if isinstance(code, str) and code in CATALOGUE and code not in ("overloaded", "internal"):
        return ServingError(code, detail=message, status=status)
    if status == 429:
        return ServingError("overloaded", retry_after=1, status=429)
    if status in (400, 404, 413, 415, 422):
        return ServingError("invalid_request", detail=f"the endpoint answered {status}: {message}")
    return ServingError("model_unavailable", detail=f"the endpoint answered {status}: {message}")


@dataclasses.dataclass
class RemoteReply:
    """What the remote streamed for one request."""

    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top_logprobs: list[dict[str, float]] = dataclasses.field(default_factory=list)
    tokens: list[str] = dataclasses.field(default_factory=list)
    """Each logprob's token as the remote names it (its own text; EOS as the remote writes it)."""
    first: float | None = None
    finish: str | None = None
    stop_reason: Any = None
    usage: dict[str, Any] | None = None
    streamed: bool = False


def cached_tokens_of(usage: dict[str, Any]) -> int | None:
    """The prefix-cache hits a remote's usage reports (`prompt_tokens_details.cached_tokens`), None if none.

    vLLM says it with --enable-prompt-tokens-details, servegate whenever its manifest has a prefix cache.
    """
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0 else None


def no_logprobs(base_url: str, why: str) -> ServingError:
    """The catalogued refusal of a request that asks for logprobs a remote does not give."""
    return ServingError(
        "unsupported_parameter",
        param="logprobs",
        detail=f"the endpoint {base_url} returns no log-probabilities for generated tokens: {why}",
    )


def completions_body(
    model: str, admitted: AdmittedRequest, cache_salt: str | None, vllm: bool, token_logprobs: bool = False
) -> dict[str, Any]:
    """The completions request a remote gets: the prompt as the manifest made it, as token ids, streamed.

    `token_logprobs`: ask for logprobs although the client did not, so that the remote names its tokens
    (a remote other than vLLM sends no token ids)."""
    p = admitted.request.params
    body: dict[str, Any] = {
        "model": model,
        "prompt": admitted.token_ids,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": admitted.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "seed": admitted.seed,
    }
    if p.top_k:
        body["top_k"] = p.top_k
    if admitted.stop:
        body["stop"] = list(admitted.stop)
    if p.ignore_eos:
        body["ignore_eos"] = True
    body.update(shaping_fields(p))
    if p.constraint is not None:
        body["structured_outputs"] = p.constraint.as_structured_outputs()
    if p.logprobs or p.top_logprobs:
        body["logprobs"] = max(1, p.top_logprobs)
    elif token_logprobs:
        body["logprobs"] = 1
    if vllm:
        body["return_token_ids"] = True  # token ids as generated, not re-tokenized text
        if cache_salt is not None:
            body["cache_salt"] = cache_salt  # vLLM's prefix cache, scoped per tenant as the manifest says
    return body


def shaping_fields(p: SamplingParams) -> dict[str, Any]:
    """The penalty, bias, min_p, min_tokens and stop-id fields a remote gets, in vLLM's spelling (the first three
    are also OpenAI's), only those that ask for something: a remote that does not know a field is not sent it
    for nothing."""
    fields: dict[str, tuple[Any, Any]] = {  # name: (value, neutral value)
        "presence_penalty": (p.presence_penalty, 0.0),
        "frequency_penalty": (p.frequency_penalty, 0.0),
        "repetition_penalty": (p.repetition_penalty, 1.0),
        "logit_bias": ({str(token): bias for token, bias in p.logit_bias}, {}),
        "min_p": (p.min_p, 0.0),
        "min_tokens": (p.min_tokens, 0),
        "stop_token_ids": (list(p.stop_token_ids), []),
        "include_stop_str_in_output": (p.include_stop_str, False),
        "skip_special_tokens": (p.skip_special_tokens, True),
        "return_tokens_as_token_ids": (p.tokens_as_ids, False),
    }
    return {name: value for name, (value, neutral) in fields.items() if value != neutral}


def read_choice(
    rid: str, choice: dict[str, Any], reply: RemoteReply, wanted: bool = True, alternatives_wanted: bool = True
) -> TokenEvent | None:
    """Fold one streamed completions choice into `reply`; a TokenEvent when it carries text or tokens.

    `wanted`, `alternatives_wanted`: the client asked for logprobs, for top alternatives (else the event
    carries none, though the remote sent them)."""
    text = choice.get("text") or ""
    if choice.get("finish_reason"):
        reply.finish = str(choice["finish_reason"])
        reply.stop_reason = choice.get("stop_reason")
    ids = [int(t) for t in choice.get("token_ids") or []]
    reply.token_ids.extend(ids)
    logprobs = choice.get("logprobs") or {}
    raw = logprobs.get("token_logprobs") or []
    names = list(logprobs.get("tokens") or [])
    tops = list(logprobs.get("top_logprobs") or [])
    values, named, alternatives = [], [], []
    for i, value in enumerate(raw):  # one entry per token; the lists line up by position
        if value is None:
            continue
        values.append(float(value))
        named.append(str(names[i]) if i < len(names) else "")
        top = tops[i] if i < len(tops) else None
        alternatives.append({str(k): float(v) for k, v in top.items()} if isinstance(top, dict) else {})
    reply.logprobs.extend(values)
    reply.tokens.extend(named)
    reply.top_logprobs.extend(alternatives)
    if not text and not ids and not values:
        return None
    now = time.monotonic()
    reply.first = reply.first or now
    reply.text += text
    if not wanted or not values:
        return TokenEvent(rid, tuple(ids), text, None, now)
    tops_out = tuple(alternatives) if alternatives_wanted else None
    return TokenEvent(rid, tuple(ids), text, tuple(values), now, top_logprobs=tops_out, tokens=tuple(named))


def final_event(
    served: ServedModel,
    validator: OutputValidator | None,
    reader: TokenReader,
    admitted: AdmittedRequest,
    reply: RemoteReply,
    base_url: str = "",
) -> FinishEvent | ErrorEvent:
    """The final result with the manifest's postprocess applied: stop strings, the output schema, the request's
    output constraint (verified on what the remote answered: it decoded under it); the token ids
    from the best source the remote gave (token_source.py). A request for logprobs the remote did not give
    gets `unsupported_parameter`, never an empty list."""
    request, now = admitted.request, time.monotonic()
    text, stopped = cut_at_stop(reply.text, admitted.stop, keep=request.params.include_stop_str)
    params = request.params
    if params.logprobs and (text or reply.token_ids) and not reply.logprobs:
        return ErrorEvent(request.id, no_logprobs(base_url, "the answer has text but no token_logprobs"))
    if params.tokens_as_ids and params.logprobs and any(token_id_of(n) is None for n in reply.tokens):
        detail = f"the endpoint {base_url} names its logprob tokens by text: it ignored return_tokens_as_token_ids"
        return ErrorEvent(request.id, ServingError("unsupported_parameter", param="return_tokens_as_token_ids",
                                                   detail=detail))  # fmt: skip
    token_ids, source = answer_tokens(reader, reply.token_ids, reply.tokens, text)
    # vLLM names what stopped it: a stop string (str), a stop token id (int; EOS is None)
    reason: Literal["stop", "length", "eos"]
    if stopped or isinstance(reply.stop_reason, str) or reply.stop_reason in params.stop_token_ids:
        reason = "stop"
    elif reply.finish == "stop":
        reason = "eos"
    else:
        reason = "length"
    valid, problem = output_problem(validator, params.constraint, text, reason, params.tool_use)
    if problem is not None and served.failure_policy.on_invalid_output == "error":
        return ErrorEvent(request.id, ServingError("invalid_output", detail=problem))
    usage = reply.usage or {}
    result = FinishEvent(
        request_id=request.id,
        text=text,
        token_ids=tuple(token_ids),
        finish_reason=reason,
        usage=Usage(
            len(admitted.token_ids),
            int(usage.get("completion_tokens") or len(token_ids)),
            admitted.truncated_tokens,
            cached_tokens_of(usage),
        ),
        logprobs=tuple(reply.logprobs) if params.logprobs else None,
        top_logprobs=tuple(reply.top_logprobs) if params.logprobs and params.top_logprobs > 0 else None,
        tokens=tuple(reply.tokens) if params.logprobs else None,
        token_source=source,
        output_valid=valid,
        ttft_s=None if reply.first is None else reply.first - admitted.arrival,
        e2e_s=now - admitted.arrival,
    )
    return result
