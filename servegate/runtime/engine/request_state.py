"""One request inside the reference engine: its sequence, output stream, deadline and event delivery."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.contract_layer import admit
from servegate.runtime.engine.delivery import EventDelivery
from servegate.runtime.engine.step_trace import StepTrace
from servegate.runtime.postprocess import OutputStream, OutputValidator, output_problem
from servegate.runtime.scheduling import Sequence
from servegate.runtime.types import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    SamplingParams,
    Sink,
    Usage,
    token_id_name,
)

if TYPE_CHECKING:
    from servegate.runtime.engine.parts import EngineParts


@dataclass(eq=False)
class RequestState:
    """Everything the engine tracks for one accepted request."""

    request: GenerationRequest
    delivery: EventDelivery
    """Sends the request's events to its sink (outside the engine lock), and nothing after the final one."""
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
    prefix_caching: bool = False
    """The manifest declares a KV prefix cache, so usage reports its hits (prompt_tokens_details)."""
    first_token_at: float | None = None
    aborted: bool = False
    """The caller stopped listening (set under the engine lock; the loop drops it at the next step)."""
    top_logprobs: list[dict[str, float]] = field(default_factory=list)
    """Per output token, the top alternatives (only when the request asks for top_logprobs)."""
    matcher: Any = None
    """The grammar engine's matcher of the request's output constraint (None: unconstrained)."""
    refused_token: int | None = None
    """A sampled token the matcher refused although its mask allowed it: the output breaks its constraint."""

    @property
    def params(self) -> SamplingParams:
        """The request's sampling parameters."""
        return self.request.params

    def finish_event(self, now: float, validator: OutputValidator | None) -> FinishEvent | ErrorEvent:
        """The final event: the result, or invalid_output when the output schema or the request's constraint
        says so and the policy is error."""
        out = self.output
        valid, problem = output_problem(
            validator, self.params.constraint, out.text, out.finish_reason or "length", self.params.tool_use
        )
        if self.refused_token is not None:
            where = self.params.constraint.param if self.params.constraint is not None else "constraint"
            valid, problem = False, f"{where}: the grammar engine refused token {self.refused_token} its mask allowed"
        if problem is not None and not self.flag_invalid:
            return ErrorEvent(self.request.id, ServingError("invalid_output", detail=problem))
        return FinishEvent(
            request_id=self.request.id,
            text=out.text,
            token_ids=tuple(out.token_ids),
            finish_reason=out.finish_reason or "length",
            usage=Usage(
                self.seq.num_prompt_tokens,
                len(out.token_ids),
                self.truncated_tokens,
                self.seq.num_cached_tokens if self.prefix_caching else None,
            ),
            logprobs=tuple(out.logprobs) if self.params.logprobs else None,
            top_logprobs=tuple(self.top_logprobs) if self.params.top_logprobs > 0 else None,
            tokens=tuple(token_id_name(t) for t in out.token_ids) if self.params.tokens_as_ids else None,
            output_valid=valid,
            ttft_s=None if self.first_token_at is None else self.first_token_at - self.arrival,
            e2e_s=now - self.arrival,
        )


def new_request_state(
    served: ServedModel,
    parts: EngineParts,
    request: GenerationRequest,
    sink: Sink,
    seq_id: int,
    trace: StepTrace | None = None,
) -> RequestState:
    """Validate and encode a request into engine state (raises ServingError for a bad request); `trace`
    records when its first token and final event go to `sink`."""
    from servegate.runtime.model.sampling import request_generator

    # a generating engine has all three (they are None only for task: embed)
    assert parts.preprocessor is not None and parts.tokenizer is not None and parts.runner is not None
    admitted = admit(served, parts.preprocessor, request)
    matcher = _constraint_matcher(parts, request)
    prompt = admitted.token_ids
    output = OutputStream(
        parts.tokenizer,
        max_tokens=admitted.max_tokens,
        stop=admitted.stop,
        eos_token_ids=frozenset(parts.runner.eos_token_ids),
        ignore_eos=request.params.ignore_eos,
        prompt_token_ids=prompt,
        stop_token_ids=frozenset(request.params.stop_token_ids),
        min_tokens=request.params.min_tokens,
        include_stop=request.params.include_stop_str,
        skip_special_tokens=request.params.skip_special_tokens,
    )
    seq = Sequence(
        seq_id,
        prompt,
        admitted.max_tokens,
        arrival_time=admitted.arrival,
        cache_salt=admitted.cache_salt,
        request_id=request.id,
    )
    return RequestState(
        request=request,
        delivery=EventDelivery(sink, trace, request.id),
        seq=seq,
        output=output,
        generator=request_generator(admitted.seed, parts.device),
        arrival=admitted.arrival,
        deadline=admitted.deadline,
        timeout_s=admitted.timeout_s,
        truncated_tokens=admitted.truncated_tokens,
        flag_invalid=served.failure_policy.on_invalid_output == "flag",
        prefix_caching=served.runtime.kv_cache is not None and served.runtime.kv_cache.prefix_caching,
        matcher=matcher,
    )


def _constraint_matcher(parts: EngineParts, request: GenerationRequest) -> Any:
    """A matcher for the request's output constraint (ServingError when it does not compile, or when the
    manifest declares no structured output)."""
    constraint = request.params.constraint
    if constraint is None:
        return None
    if parts.grammar is None:
        detail = "this deployment declares no postprocess.structured_output"
        raise ServingError("unsupported_parameter", param=constraint.param, detail=detail)
    return parts.grammar.matcher(constraint)
