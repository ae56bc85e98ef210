"""The next token of each request a step computed the last position of: sampled outside the engine lock.

Sampling is per row (each request's own parameters and seeded generator), so a row's token never depends
on the other rows of the batch: greedy output stays the unbatched output whatever ran beside it. Penalties,
logit_bias and min_tokens reshape the logits first (`model/logit_processors`); the log-probabilities clients
get stay those of the model's raw logits. An output constraint comes before everything: its grammar mask
(`model/grammar_mask`) sets disallowed tokens to -inf, and, as in vLLM, the log-probabilities are those of
the masked logits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from servegate.runtime.engine.parts import EngineParts
from servegate.runtime.engine.request_state import RequestState

log = logging.getLogger(__name__)


@dataclass
class SampledTokens:
    """What one step sampled, by sequence id."""

    tokens: dict[int, int] = field(default_factory=dict)
    logprobs: dict[int, float] = field(default_factory=dict)
    """Each token's log-probability: every sampled row's when a request of the step asks for logprobs, else none."""


def sample_rows(parts: EngineParts, logits: Any, rows: list[tuple[int, RequestState]]) -> SampledTokens:
    """Sample the given rows of `logits` [chunks, vocab] (row index, its request), and their top alternatives
    for requests that ask for top_logprobs."""
    sampled = SampledTokens()
    if not rows:
        return sampled
    states = [state for _, state in rows]
    raw = _float_rows(logits, [row for row, _ in rows])
    constrained = [i for i, s in enumerate(states) if s.matcher is not None]
    if constrained:
        raw = _masked(parts, raw, [states[i] for i in constrained], constrained)
    params = [s.params for s in states]
    reshaped = _reshaped(raw, states) if any(p.reshapes_logits() for p in params) else raw
    tokens, logprobs = parts.sampler(reshaped, params, [s.generator for s in states])
    if logprobs is not None and reshaped is not raw:
        from servegate.runtime.model.sampling import chosen_logprobs

        logprobs = chosen_logprobs(raw, _long(tokens, raw.device))
    for state, token in zip(states, _as_list(tokens), strict=True):
        sampled.tokens[state.seq.seq_id] = int(token)
    if logprobs is not None:  # the sampler leaves them out when no request asks (model/sampling.sample_batch)
        for state, logprob in zip(states, _as_list(logprobs), strict=True):
            sampled.logprobs[state.seq.seq_id] = float(logprob)
    for i in constrained:
        state = states[i]
        token = sampled.tokens[state.seq.seq_id]
        # a constrained row exists only where the manifest declares structured output, so parts.grammar is set
        if not parts.grammar.advance(state.matcher, token):  # type: ignore[union-attr]
            # the rest goes unconstrained; the final event reports the broken constraint as the policy says
            log.warning("request %s: the grammar engine refused token %d its mask allowed", state.request.id, token)
            state.matcher, state.refused_token = None, token
    for i, state in enumerate(states):
        if state.params.top_logprobs > 0:
            named = None if state.params.tokens_as_ids else parts.tokenizer
            state.top_logprobs.append(_alternatives(raw[i], state.params.top_logprobs, named))
    return sampled


def _float_rows(logits: Any, rows: list[int]) -> Any:
    """The sampled rows of `logits` in float32: no copy when they are every row and already float32.

    Everything after this computes in float32, as transformers and vLLM sample, so converting once here changes
    no result; it saves time, since torch's bfloat16 argmax and log-softmax on CPU cost several times their
    float32 forms (benchmarks/README.md, "Sampling bfloat16 logits")."""
    every_row = rows == list(range(logits.shape[0]))
    return (logits if every_row else logits[rows]).float()


def _masked(parts: EngineParts, raw: Any, states: list[RequestState], rows: list[int]) -> Any:
    """The rows' logits with each constrained row's disallowed tokens at -inf (float32; what vLLM samples from
    and reports log-probabilities of)."""
    from servegate.runtime.model.grammar_mask import apply_mask

    assert parts.grammar is not None, "a constrained request needs the engine's grammar mask"
    allowed = parts.grammar.allowed([s.matcher for s in states], raw.shape[-1])
    out = raw.float().clone()
    out[rows] = apply_mask(out[rows], allowed)
    return out


def _reshaped(logits: Any, states: list[RequestState]) -> Any:
    """The rows' logits with their penalties, bias and min_tokens mask applied."""
    from servegate.runtime.model.logit_processors import TokenHistory, reshape_logits

    histories = [TokenHistory(s.seq.prompt_token_ids, s.output.token_ids, s.output.ending_ids()) for s in states]
    return reshape_logits(logits, [s.params for s in states], histories)


def _long(tokens: Any, device: Any) -> Any:
    """Sampled token ids as a long tensor on the logits' device (a sampler may return a list)."""
    import torch

    return torch.as_tensor(_as_list(tokens), dtype=torch.long, device=device)


def _alternatives(logits: Any, n: int, tokenizer: Any) -> dict[str, float]:
    """The n most likely tokens at one position, as {token text: log-probability} (tokenizer None: named
    `token_id:<id>`)."""
    from servegate.runtime.model.sampling import top_logprobs
    from servegate.runtime.types import token_id_name

    values, ids = top_logprobs(logits[None], n)
    pairs = zip(values[0].tolist(), ids[0].tolist(), strict=True)
    if tokenizer is None:
        return {token_id_name(int(i)): float(v) for v, i in pairs}
    return {tokenizer.decode([int(i)]): float(v) for v, i in pairs}


def _as_list(values: Any) -> list[Any]:
    return values.tolist() if hasattr(values, "tolist") else list(values)
