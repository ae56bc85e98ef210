"""Sampling: greedy, temperature, top-k, top-p, per-request seeds and logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from servegate.runtime.model.sampling import (
    apply_top_k,
    apply_top_p,
    logits_to_probs,
    request_generator,
    sample,
    sample_batch,
    top_logprobs,
)
from servegate.runtime.types import SamplingParams


def test_greedy_picks_the_argmax_and_reports_its_logprob() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.5]])
    # one row asking is enough: every row's logprob is computed then (the other's is simply not reported)
    tokens, logprobs = sample_batch(logits, [SamplingParams(logprobs=True), SamplingParams()], [None, None])
    assert tokens.tolist() == [1, 0]
    expected = torch.log_softmax(logits, -1)[[0, 1], [1, 0]]
    assert logprobs is not None and torch.allclose(logprobs, expected)


def test_no_logprobs_are_computed_when_no_row_asks_and_the_tokens_are_the_same() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    params = [SamplingParams(), SamplingParams(temperature=0.7, seed=1)] * 2
    quiet, none = sample_batch(logits, params, [None, request_generator(1), None, request_generator(1)])
    asked = [SamplingParams(logprobs=True), SamplingParams(temperature=0.7, seed=1, logprobs=True)] * 2
    tokens, logprobs = sample_batch(logits, asked, [None, request_generator(1), None, request_generator(1)])
    assert none is None and logprobs is not None
    assert torch.equal(quiet, tokens)


def test_same_seed_same_tokens_at_any_batch_position() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    hot = SamplingParams(temperature=1.0)

    def draw(rows: list[int], seed: int, steps: int = 20) -> list[list[int]]:
        gens = [request_generator(seed) for _ in rows]
        out = [[] for _ in rows]
        for _ in range(steps):
            tokens, _ = sample_batch(logits[rows], [hot] * len(rows), gens)
            for i, t in enumerate(tokens.tolist()):
                out[i].append(t)
        return out

    alone = draw([2], seed=7)[0]
    assert draw([0, 1, 2, 3], seed=7)[2] == alone  # row 2's samples do not depend on the batch
    assert draw([2], seed=7)[0] == alone
    assert draw([2], seed=8)[0] != alone


def test_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.1, 0.6, 0.3])
    gen = request_generator(0)
    counts = torch.bincount(torch.stack([sample(probs, gen) for _ in range(4000)]), minlength=3)
    assert torch.allclose(counts / 4000, probs, atol=0.03)


def test_temperature_sharpens_and_flattens() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0])
    cold, warm = logits_to_probs(logits, 0.25), logits_to_probs(logits, 4.0)
    assert cold[2] > torch.softmax(logits, -1)[2] > warm[2]
    with pytest.raises(ValueError, match="greedy"):
        logits_to_probs(logits, 0.0)


def test_top_k_keeps_only_the_k_best() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    kept = torch.isfinite(apply_top_k(logits, 2))
    assert kept.tolist() == [[False, True, False, True, False]]
    assert torch.equal(apply_top_k(logits, 0), logits)
    gen = request_generator(1)
    probs = logits_to_probs(logits[0], 1.0, top_k=2)
    assert {int(sample(probs, gen)) for _ in range(200)} == {1, 3}


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.05, 0.3, 0.15]))
    assert torch.isfinite(apply_top_p(logits, 0.7)).tolist() == [True, False, True, False]
    assert torch.isfinite(apply_top_p(logits, 0.8)).tolist() == [True, False, True, False]
    assert torch.isfinite(apply_top_p(logits, 0.81)).tolist() == [True, False, True, True]
    assert torch.isfinite(apply_top_p(logits, 0.01)).tolist() == [True, False, False, False]
    probs = logits_to_probs(logits, 1.0, top_p=0.7)
    assert math.isclose(float(probs[0]), 0.5 / 0.8, rel_tol=1e-5)


def test_logprobs_are_the_models_not_the_sampling_distributions() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    params = [SamplingParams(temperature=0.1, top_k=1, logprobs=True)]
    tokens, logprobs = sample_batch(logits, params, [request_generator(0)])
    assert tokens.tolist() == [2] and logprobs is not None
    assert math.isclose(float(logprobs[0]), float(torch.log_softmax(logits, -1)[0, 2]), rel_tol=1e-6)
    values, ids = top_logprobs(logits, 2)
    assert ids.tolist() == [[2, 1]] and values[0, 0] > values[0, 1]


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="rows"):
        sample_batch(torch.zeros(2, 3), [SamplingParams()], [None])
