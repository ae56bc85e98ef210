"""The OpenAI shapes of generated-token log-probabilities, for whole answers and stream chunks alike.

Completions: `{tokens, token_logprobs, top_logprobs, text_offset}`, four lists of one length (top_logprobs is
null when no alternatives were asked for). Chat: `{content: [{token, logprob, bytes, top_logprobs}]}`.
There is one entry per log-probability: a token name or an alternatives entry the engine did not give is
filled in (`""`, `{}`), never left out, so the lists always line up. The server's bodies and `gate run`'s
output lines are built here, so both say the same thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _aligned(
    tokens: Sequence[str], values: Sequence[float], tops: Sequence[dict[str, float]] | None
) -> tuple[list[str], list[float], list[dict[str, float]] | None]:
    n = len(values)
    names = [str(t) for t in tokens[:n]] + [""] * max(0, n - len(tokens))
    alternatives = None if tops is None else [dict(t) for t in tops[:n]] + [{}] * max(0, n - len(tops))
    return names, [float(v) for v in values], alternatives


def completion_logprobs(
    tokens: Sequence[str], values: Sequence[float], tops: Sequence[dict[str, float]] | None, start: int = 0
) -> dict[str, Any]:
    """The completions API's logprobs object; `start`: the text offset of the first token (a stream's chunk)."""
    names, numbers, alternatives = _aligned(tokens, values, tops)
    offsets, at = [], start
    for name in names:
        offsets.append(at)
        at += len(name)
    return {"tokens": names, "token_logprobs": numbers, "top_logprobs": alternatives, "text_offset": offsets}


def chat_logprobs(
    tokens: Sequence[str], values: Sequence[float], tops: Sequence[dict[str, float]] | None
) -> dict[str, Any]:
    """The chat API's logprobs object, {content: [{token, logprob, bytes, top_logprobs}]}."""
    names, numbers, alternatives = _aligned(tokens, values, tops)
    content = []
    for i, (name, value) in enumerate(zip(names, numbers, strict=True)):
        top = alternatives[i] if alternatives is not None else {}
        content.append(
            {
                "token": name,
                "logprob": value,
                "bytes": list(name.encode("utf-8")),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))} for t, lp in top.items()
                ],
            }
        )
    return {"content": content}
