"""What a remote's streamed completions mean: the request it gets, the chunks it sends back, the final result.

Plain functions over plain data (no client, no event loop), so the endpoint engine stays the part that
waits, and each translation can be read and tested on its own.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from servegate.contracts.errors import CATALOGUE, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.contract_layer import AdmittedRequest, trim_at_stop
from servegate.runtime.engine.interface import ErrorEvent, FinishEvent, TokenEvent, Usage
from servegate.runtime.postprocess import OutputValidator


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
    first: float | None = None
    finish: str | None = None
    stop_reason: Any = None
    usage: dict[str, Any] | None = None
    streamed: bool = False


def completions_body(model: str, admitted: AdmittedRequest, cache_salt: str | None, vllm: bool) -> dict[str, Any]:
    """The completions request a remote gets: the prompt as the manifest made it, as token ids, streamed."""
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
    if p.logprobs or p.top_logprobs:
        body["logprobs"] = max(1, p.top_logprobs)
    if vllm:
        body["return_token_ids"] = True  # token ids as generated, not re-tokenized text
        if cache_salt is not None:
            body["cache_salt"] = cache_salt  # vLLM's prefix cache, scoped per tenant as the manifest says
    return body


def read_choice(rid: str, choice: dict[str, Any], reply: RemoteReply) -> TokenEvent | None:
    """Fold one streamed completions choice into `reply`; a TokenEvent when it carries text."""
    text = choice.get("text") or ""
    if choice.get("finish_reason"):
        reply.finish = str(choice["finish_reason"])
        reply.stop_reason = choice.get("stop_reason")
    ids = [int(t) for t in choice.get("token_ids") or []]
    reply.token_ids.extend(ids)
    logprobs = choice.get("logprobs") or {}
    values = [float(v) for v in logprobs.get("token_logprobs") or [] if v is not None]
    reply.logprobs.extend(values)
    reply.top_logprobs.extend(dict(t) for t in logprobs.get("top_logprobs") or [] if t is not None)
    if not text and not ids:
        return None
    now = time.monotonic()
    reply.first = reply.first or now
    reply.text += text
    return TokenEvent(rid, tuple(ids), text, tuple(values) if values else None, now)


def final_event(
    served: ServedModel,
    validator: OutputValidator | None,
    tokenizer: Any,
    admitted: AdmittedRequest,
    reply: RemoteReply,
) -> FinishEvent | ErrorEvent:
    """The final result with the manifest's postprocess applied: stop strings, the output schema."""
    request, now = admitted.request, time.monotonic()
    text, stopped = trim_at_stop(reply.text, admitted.stop)
    token_ids = reply.token_ids
    if not token_ids and text:  # a remote that does not return ids: the manifest's tokenizer reads the text
        token_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if stopped or isinstance(reply.stop_reason, str):
        reason = "stop"
    elif reply.finish == "stop":
        reason = "eos"
    else:
        reason = "length"
    valid = None
    if validator is not None:
        problem = validator.problem(text)
        valid = problem is None
        if problem is not None and served.failure_policy.on_invalid_output == "error":
            return ErrorEvent(request.id, ServingError("invalid_output", detail=problem))
    usage = reply.usage or {}
    params = request.params
    result = FinishEvent(
        request_id=request.id,
        text=text,
        token_ids=tuple(token_ids),
        finish_reason=reason,  # type: ignore[arg-type]
        usage=Usage(
            len(admitted.token_ids),
            int(usage.get("completion_tokens") or len(token_ids)),
            admitted.truncated_tokens,
        ),
        logprobs=tuple(reply.logprobs) if params.logprobs else None,
        top_logprobs=tuple(reply.top_logprobs) if params.top_logprobs > 0 else None,
        output_valid=valid,
        ttft_s=None if reply.first is None else reply.first - admitted.arrival,
        e2e_s=now - admitted.arrival,
    )
    return result
