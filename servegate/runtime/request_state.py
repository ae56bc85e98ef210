"""One request inside the reference engine: its sequence, output stream, deadline and event sink."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.api import ErrorEvent, FinishEvent, GenerationRequest, SamplingParams, Usage
from servegate.runtime.failure import Sink
from servegate.runtime.postprocess import OutputStream, OutputValidator
from servegate.runtime.scheduling import Sequence

if TYPE_CHECKING:
    from servegate.runtime.engine_setup import EngineParts


@dataclass(eq=False)
class RequestState:
    """Everything the engine tracks for one accepted request."""

    request: GenerationRequest
    sink: Sink
    """Receives the request's events (called with the engine lock held: it must not block)."""
    seq: Sequence
    output: OutputStream
    generator: Any
    """torch.Generator seeded with the request's seed (or runtime.seed)."""
    arrival: float
    deadline: float
    """time.monotonic() past which the request fails with deadline_exceeded."""
    timeout_s: float
    truncated_tokens: int
    flag_invalid: bool
    """on_invalid_output: flag (True) or error (False)."""
    first_token_at: float | None = None
    streamed: bool = False
    """Whether any TokenEvent went out (a request that streamed cannot switch to the fallback)."""
    aborted: bool = False
    top_logprobs: list[dict[str, float]] = field(default_factory=list)
    """Per output token, the top alternatives (only when the request asks for top_logprobs)."""

    @property
    def params(self) -> SamplingParams:
        """The request's sampling parameters."""
        return self.request.params

    def finish_event(self, now: float, validator: OutputValidator | None) -> FinishEvent | ErrorEvent:
        """The final event: the result, or invalid_output when the schema says so and the policy is error."""
        out = self.output
        valid = None
        if validator is not None:
            problem = validator.problem(out.text)
            valid = problem is None
            if problem is not None and not self.flag_invalid:
                return ErrorEvent(self.request.id, ServingError("invalid_output", detail=problem))
        return FinishEvent(
            request_id=self.request.id,
            text=out.text,
            token_ids=tuple(out.token_ids),
            finish_reason=out.finish_reason or "length",
            usage=Usage(self.seq.num_prompt_tokens, len(out.token_ids), self.truncated_tokens),
            logprobs=tuple(out.logprobs) if self.params.logprobs else None,
            top_logprobs=tuple(self.top_logprobs) if self.params.top_logprobs > 0 else None,
            output_valid=valid,
            ttft_s=None if self.first_token_at is None else self.first_token_at - self.arrival,
            e2e_s=now - self.arrival,
        )


def check_params(served: ServedModel, params: SamplingParams) -> None:
    """Raise invalid_request for sampling parameters out of range or not offered by the manifest."""
    problems = [
        ("max_tokens", params.max_tokens < 1, "max_tokens must be >= 1"),
        ("temperature", params.temperature < 0, "temperature must be >= 0"),
        ("top_p", not 0 < params.top_p <= 1, "top_p must be in (0, 1]"),
        ("top_k", params.top_k < 0, "top_k must be >= 0 (0 disables it)"),
        ("seed", params.seed is not None and not 0 <= params.seed < 2**63, "seed must be in [0, 2**63)"),
        (
            "logprobs",
            (params.logprobs or params.top_logprobs > 0) and not served.postprocess.logprobs,
            "this model does not offer logprobs (postprocess.logprobs is false)",
        ),
    ]
    for param, bad, detail in problems:
        if bad:
            raise ServingError("invalid_request", param=param, detail=detail)


def new_request_state(
    served: ServedModel, parts: EngineParts, request: GenerationRequest, sink: Sink, seq_id: int
) -> RequestState:
    """Validate and encode a request into engine state (raises ServingError for a bad request)."""
    from servegate.runtime.sampling import request_generator

    check_params(served, request.params)
    encoded = parts.preprocessor.encode(request)
    prompt = list(encoded.token_ids)
    room = served.runtime.max_model_len - len(prompt)
    if not prompt:
        raise ServingError("invalid_request", param="prompt", detail="the prompt is empty")
    if room < 1:
        raise ServingError("input_too_long", tokens=len(prompt), limit=served.runtime.max_model_len - 1)
    params = request.params
    kv = served.runtime.kv_cache
    salt = (request.tenant or "") if kv is None or kv.cache_scope == "tenant" else ""
    now = time.monotonic()
    arrival = request.arrival_time if request.arrival_time is not None else now
    timeout = request.timeout_s if request.timeout_s is not None else served.failure_policy.request_timeout_s
    max_tokens = min(params.max_tokens, served.postprocess.max_output_tokens, room)
    stops = tuple(dict.fromkeys((*params.stop, *served.postprocess.stop)))
    seed = params.seed if params.seed is not None else served.runtime.seed
    generator = request_generator(seed, parts.device)
    output = OutputStream(
        parts.tokenizer,
        max_tokens=max_tokens,
        stop=stops,
        eos_token_ids=frozenset(parts.runner.eos_token_ids),
        ignore_eos=params.ignore_eos,
        prompt_token_ids=prompt,
    )
    seq = Sequence(seq_id, prompt, max_tokens, arrival_time=arrival, cache_salt=salt, request_id=request.id)
    return RequestState(
        request=request,
        sink=sink,
        seq=seq,
        output=output,
        generator=generator,
        arrival=arrival,
        deadline=arrival + timeout,
        timeout_s=timeout,
        truncated_tokens=encoded.truncated_tokens,
        flag_invalid=served.failure_policy.on_invalid_output == "flag",
    )
