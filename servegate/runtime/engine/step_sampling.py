"""The next token of each request a step computed the last position of: sampled outside the engine lock.

Sampling is per row (each request's own parameters and seeded generator), so a row's token never depends
on the other rows of the batch: greedy output stays the unbatched output whatever ran beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servegate.runtime.engine.parts import EngineParts
from servegate.runtime.engine.request_state import RequestState


@dataclass
class SampledTokens:
    """What one step sampled, by sequence id."""

    tokens: dict[int, int] = field(default_factory=dict)
    logprobs: dict[int, float] = field(default_factory=dict)


def sample_rows(parts: EngineParts, logits: Any, rows: list[tuple[int, RequestState]]) -> SampledTokens:
    """Sample the given rows of `logits` [chunks, vocab] (row index, its request), and their top alternatives
    for requests that ask for top_logprobs."""
    sampled = SampledTokens()
    if not rows:
        return sampled
    states = [state for _, state in rows]
    tokens, logprobs = parts.sampler(
        logits[[row for row, _ in rows]], [s.params for s in states], [s.generator for s in states]
    )
    for state, token, logprob in zip(states, _as_list(tokens), _as_list(logprobs), strict=True):
        sampled.tokens[state.seq.seq_id] = int(token)
        sampled.logprobs[state.seq.seq_id] = float(logprob)
    for row, state in rows:
        if state.params.top_logprobs > 0:
            state.top_logprobs.append(_alternatives(logits[row], state.params.top_logprobs, parts.tokenizer))
    return sampled


def _alternatives(logits: Any, n: int, tokenizer: Any) -> dict[str, float]:
    """The n most likely tokens at one position, as {token text: log-probability}."""
    from servegate.runtime.model.sampling import top_logprobs

    values, ids = top_logprobs(logits[None], n)
    return {tokenizer.decode([int(i)]): float(v) for v, i in zip(values[0].tolist(), ids[0].tolist(), strict=True)}


def _as_list(values: Any) -> list[Any]:
    return values.tolist() if hasattr(values, "tolist") else list(values)
