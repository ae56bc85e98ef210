"""The one translator from a parsed API body to engine requests: `gate serve`, `gate run` and the endpoint's
gateway all go through `engine_requests`, so a field means the same on every path.

The body arrives validated (`contracts/requests.parse_request` checks each field once, against the
manifest); here it only becomes requests, each built whole in one constructor: one per choice, prompt i's
choice j at index i * n + j, with the seed each choice gets.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from servegate.contracts.constraint_fields import served_constraint
from servegate.contracts.manifest import ServedModel
from servegate.contracts.request_fields import LOGIT_BIAS_LIMIT
from servegate.contracts.requests import ChatCompletionRequest, CompletionRequest
from servegate.contracts.tool_fields import tool_constraint, tool_use
from servegate.runtime.types import GenerationRequest, PromptOptions, SamplingParams

ApiRequest = CompletionRequest | ChatCompletionRequest


def choice_seed(served: ServedModel, request: ApiRequest, choice: int) -> int | None:
    """The seed of one choice: the request's (choice i: seed + i), else as preprocess.unseeded_sampling says."""
    if request.temperature == 0:
        return request.seed  # greedy: the seed changes nothing
    if request.seed is not None:
        return (request.seed + choice) % 2**63
    if served.preprocess.unseeded_sampling == "deterministic":
        return (served.runtime.seed + choice) % 2**63
    return secrets.randbits(63)


def _shaping_fields(request: ApiRequest) -> dict[str, Any]:
    """The penalty, bias, min_p, min_tokens and stop-id fields as SamplingParams takes them: logit_bias as
    (token id, bias) pairs in id order, each bias clamped to [-100, 100] as vLLM does."""
    bias = {
        int(token): max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, value))
        for token, value in (request.logit_bias or {}).items()
    }
    return {
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "repetition_penalty": request.repetition_penalty,
        "logit_bias": tuple(sorted(bias.items())),
        "min_p": request.min_p,
        "min_tokens": request.min_tokens,
        "stop_token_ids": tuple(dict.fromkeys(request.stop_token_ids or ())),
        "include_stop_str": request.include_stop_str_in_output,
        "skip_special_tokens": request.skip_special_tokens,
        "tokens_as_ids": request.return_tokens_as_token_ids,
    }


def _prompt_options(served: ServedModel, request: ApiRequest) -> PromptOptions:
    """The request's own rendering (chat) and truncation of its prompt."""
    cut: dict[str, Any] = {
        "truncate_prompt_tokens": request.truncation_limit(served.preprocess.max_input_tokens),
        "truncation_side": request.truncation_side,
    }
    if not isinstance(request, ChatCompletionRequest):
        return PromptOptions(**cut)
    return PromptOptions(
        add_generation_prompt=request.add_generation_prompt,
        continue_final_message=request.continue_final_message,
        template_kwargs=tuple(sorted((request.chat_template_kwargs or {}).items())),
        chat_template=request.chat_template,
        **cut,
    )


def _messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The chat messages as the chat template takes them: a participant's `name` kept, an earlier call's
    arguments as an object (as vLLM hands them to templates, which write them with `tojson`)."""
    out = []
    for m in request.messages:
        message: dict[str, Any] = {"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
        if m.tool_calls:
            message["tool_calls"] = [_earlier_call(c.id, c.function.name, c.function.arguments) for c in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


def _earlier_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    try:
        value: Any = json.loads(arguments)
    except json.JSONDecodeError:
        value = arguments  # a template gets the text as it came
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": value}}


def _prompt_fields(request: ApiRequest, prompt: str | list[int] | None) -> dict[str, Any]:
    """The one prompt field a request carries: messages (and the tools they may call), prompt text or prompt
    token ids."""
    if isinstance(request, ChatCompletionRequest):
        return {"messages": _messages(request), "tools": request.rendered_tools()}
    if isinstance(prompt, str):
        return {"prompt": prompt}
    return {"prompt_token_ids": list(prompt or ())}


def engine_requests(
    served: ServedModel,
    request: ApiRequest,
    request_id: str,
    tenant: str | None,
    arrival_time: float | None = None,
) -> list[GenerationRequest]:
    """The engine's requests for a completion or chat body: one per choice, prompt i's choice j at i * n + j.

    `arrival_time` (time.monotonic()) starts each deadline; None starts it when the engine takes the request
    (`gate run` submits a file's lines over minutes, so each line's deadline is its own).
    """
    if isinstance(request, ChatCompletionRequest):
        top_logprobs = request.top_logprobs or 0
        prompts: list[str | list[int] | None] = [None]
    else:
        top_logprobs = request.logprobs or 0
        prompts = list(request.prompts())
    several = len(prompts) * request.n > 1
    post = served.postprocess
    constraint = served_constraint(post.structured_output, post.output_schema, request)
    options = _prompt_options(served, request)
    tools = tool_use(post.tools, request) if isinstance(request, ChatCompletionRequest) else None
    if tools is not None and tools.mode != "auto" and isinstance(request, ChatCompletionRequest):
        compact = post.structured_output is not None and post.structured_output.whitespace == "compact"
        constraint = tool_constraint(request, compact)
    return [
        GenerationRequest(
            id=f"{request_id}-{index}" if several else request_id,
            params=SamplingParams(
                max_tokens=request.output_limit(served.postprocess.max_output_tokens),
                temperature=request.temperature,
                top_p=request.top_p,
                top_k=request.top_k,
                seed=choice_seed(served, request, index % request.n),
                stop=tuple(request.stop or ()),
                logprobs=request.wants_logprobs(),
                top_logprobs=top_logprobs,
                ignore_eos=request.ignore_eos,
                constraint=constraint,
                tool_use=tools,
                **_shaping_fields(request),
            ),
            prompt_options=options,
            tenant=tenant,
            arrival_time=arrival_time,
            from_api=True,
            **_prompt_fields(request, prompts[index // request.n]),
        )
        for index in range(len(prompts) * request.n)
    ]


__all__ = ["ApiRequest", "choice_seed", "engine_requests"]
