"""Logits reshaped by each request's bias, min_tokens and penalties before sampling, vectorised over the batch.

The order is vLLM's (its v1 sampler): `logit_bias` and the `min_tokens` mask first, then the repetition,
frequency and presence penalties; temperature, `min_p`, top-k and top-p follow in `sampling`. Because the
penalties come first, they change greedy output too.

- repetition_penalty r, on every token of the prompt or the output so far: a logit l > 0 becomes l / r, any
  other l * r (r > 1 discourages repeating, r < 1 encourages it);
- frequency_penalty f and presence_penalty p, on the output so far only (as vLLM; OpenAI says "the text so
  far"): l - f * count - p * (count > 0);
- min_tokens m: while fewer than m tokens have been generated, EOS and the stop token ids get -inf.

Every operation is elementwise within a row, over counts of that row's own tokens, so a row's result never
depends on what else is in the batch: batch invariance holds exactly. Rows that ask for none of this are left
as they are. The log-probabilities returned to clients stay those of the raw logits (vLLM's default,
`raw_logprobs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from servegate.runtime.types import SamplingParams


@dataclass(frozen=True)
class TokenHistory:
    """What one request's penalties and min_tokens look at."""

    prompt: Sequence[int]
    """The prompt's token ids (the repetition penalty counts them)."""
    output: Sequence[int]
    """Every token generated so far."""
    ending_ids: frozenset[int] = frozenset()
    """Ids that would end the output (EOS unless ignore_eos, and the stop token ids): held back by min_tokens."""


def _counts(histories: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """How often each token id occurs in each row's ids: [rows, vocab] float32 (padding goes to a dropped column)."""
    width = max((len(ids) for ids in histories), default=0)
    counts = torch.zeros(len(histories), vocab + 1, dtype=torch.float32, device=device)
    if width == 0:
        return counts[:, :vocab]
    ids = torch.full((len(histories), width), vocab, dtype=torch.long, device=device)
    for row, seq in enumerate(histories):
        if seq:
            ids[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab]


def _column(values: Sequence[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)[:, None]


def _add_bias(logits: torch.Tensor, params: Sequence[SamplingParams]) -> None:
    """logit_bias added in place (admission checks ids against the vocabulary; ids past the logits' width, which
    a tokenizer larger than its model could name, are left out)."""
    width = logits.shape[-1]
    entries = [(row, token, value) for row, p in enumerate(params) for token, value in p.logit_bias if token < width]
    if not entries:
        return
    rows, ids, bias = zip(*entries, strict=True)
    device = logits.device
    logits.index_put_(
        (torch.tensor(rows, device=device), torch.tensor(ids, device=device)),
        torch.tensor(bias, dtype=logits.dtype, device=device),
        accumulate=True,
    )


def _hold_back_endings(
    logits: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[TokenHistory]
) -> None:
    """-inf on the ending ids of rows that have generated fewer than min_tokens tokens."""
    pairs = [
        (row, token)
        for row, (p, h) in enumerate(zip(params, histories, strict=True))
        if len(h.output) < p.min_tokens
        for token in h.ending_ids
        if token < logits.shape[-1]
    ]
    if pairs:
        rows, ids = zip(*pairs, strict=True)
        logits[torch.tensor(rows, device=logits.device), torch.tensor(ids, device=logits.device)] = float("-inf")


def _penalise(
    logits: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[TokenHistory]
) -> torch.Tensor:
    """The repetition, frequency and presence penalties of every row, in one pass over [rows, vocab]."""
    device, vocab = logits.device, logits.shape[-1]
    output_counts = _counts([h.output for h in histories], vocab, device)
    seen_in_output = output_counts > 0
    if any(p.repetition_penalty != 1.0 for p in params):
        repetition = _column([p.repetition_penalty for p in params], device)
        seen = seen_in_output | (_counts([h.prompt for h in histories], vocab, device) > 0)
        penalised = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen, penalised, logits)
    frequency = _column([p.frequency_penalty for p in params], device)
    presence = _column([p.presence_penalty for p in params], device)
    return logits - frequency * output_counts - presence * seen_in_output.float()


def reshape_logits(
    logits: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[TokenHistory]
) -> torch.Tensor:
    """logits [B, V] with each row's logit_bias, min_tokens mask and penalties applied (float32 where any row
    asks for one; the same tensor when none does)."""
    if not (len(params) == len(histories) == logits.shape[0]):
        raise ValueError(f"{logits.shape[0]} rows of logits need as many params and token histories")
    rows = [row for row, p in enumerate(params) if p.reshapes_logits()]
    if not rows:
        return logits
    out = logits.float().clone()
    picked = [params[row] for row in rows]
    history = [histories[row] for row in rows]
    index = torch.tensor(rows, device=logits.device)
    part = out[index]
    _add_bias(part, picked)
    _hold_back_endings(part, picked, history)
    if any(p.penalises() for p in picked):
        part = _penalise(part, picked, history)
    out[index] = part
    return out
