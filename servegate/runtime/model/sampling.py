"""Choosing the next token: small pure tensor functions, one request per row.

Every row is processed on its own (its own temperature, top-k, top-p and torch.Generator), so a
request's tokens never depend on what else is in the batch: same seed, same output, at any batch size.
Log-probabilities are those of the model's own distribution (log-softmax of the raw logits), before
temperature, min-p, top-k and top-p reshape it for sampling. Penalties and logit_bias come before this
(`logit_processors`), in vLLM's order: temperature, then min-p, then top-k and top-p.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from servegate.runtime.types import SamplingParams


def request_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch.Generator seeded for one request (the same seed replays the same samples)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed % 2**64)
    return generator


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """logits [..., V] with everything below the k-th largest set to -inf (k <= 0: unchanged)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """logits [..., V] without the tokens whose probability is below min_p times the likeliest's (min_p <= 0:
    unchanged)."""
    if min_p <= 0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    floor = min_p * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < floor, float("-inf"))


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """logits [..., V] keeping the smallest set of top tokens whose probability reaches p (p >= 1: unchanged)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    # a token is dropped when the tokens ranked above it already reach p; the top token always stays
    above = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = above >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def logits_to_probs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> torch.Tensor:
    """Sampling distribution [..., V] from logits [..., V]: temperature, then min-p, then top-k, then top-p
    (temperature > 0)."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0 to sample (temperature 0 is greedy: use argmax)")
    scaled = apply_min_p(logits.float() / temperature, min_p)
    return torch.softmax(apply_top_p(apply_top_k(scaled, top_k), top_p), dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row of probs [..., V] (the exponential race: argmax of p / Exp(1) noise)."""
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return torch.argmax(probs / noise, dim=-1)


def chosen_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log p(token) under the model's distribution: logits [B, V], token_ids [B] -> [B] float32."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, token_ids[:, None])[:, 0]


def top_logprobs(logits: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The n most likely tokens per row: (logprobs [B, n] float32, token ids [B, n])."""
    values, ids = torch.topk(torch.log_softmax(logits.float(), dim=-1), n, dim=-1)
    return values, ids


def sample_batch(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next tokens for logits [B, V]: (token ids [B] long, their logprobs [B] float32, or None when no row's params
    ask for logprobs: a log-softmax over the vocabulary that nobody reads is most of a greedy step's sampling).

    Row i uses params[i] and generators[i]; temperature 0 is greedy and consumes no randomness.
    """
    if not (len(params) == len(generators) == logits.shape[0]):
        raise ValueError(f"{logits.shape[0]} rows of logits need as many params and generators")
    tokens = torch.argmax(logits, dim=-1)
    for row, (p, generator) in enumerate(zip(params, generators, strict=True)):
        if p.temperature > 0:
            probs = logits_to_probs(logits[row], p.temperature, p.top_k, p.top_p, p.min_p)
            tokens[row] = sample(probs, generator)
    return tokens, chosen_logprobs(logits, tokens) if any(p.logprobs for p in params) else None
