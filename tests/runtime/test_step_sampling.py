"""The engine's step sampling: bfloat16 logits sampled in float32, the rows a step samples picked in order."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from servegate.runtime.engine.step_sampling import sample_rows
from servegate.runtime.model.sampling import sample_batch
from servegate.runtime.types import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from step_sampling import request as _state  # noqa: E402  (what sample_rows reads of a request, one definition)


def _parts() -> SimpleNamespace:
    return SimpleNamespace(sampler=sample_batch, grammar=None, tokenizer=None)


def test_bfloat16_logits_give_the_tokens_and_logprobs_of_their_float32_values() -> None:
    logits = torch.randn(5, 4000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    asks = SamplingParams(logprobs=True)
    rows = [(3, _state(30, asks)), (0, _state(0, asks)), (4, _state(40, asks))]
    sampled = sample_rows(_parts(), logits, rows)  # type: ignore[arg-type]
    exact = logits.float()[[3, 0, 4]]
    tokens, logprobs = sample_batch(exact, [asks] * 3, [None] * 3)
    assert sampled.tokens == {30: tokens[0].item(), 0: tokens[1].item(), 40: tokens[2].item()}
    assert sampled.tokens[30] == int(exact[0].argmax())
    assert logprobs is not None
    assert sampled.logprobs == {30: logprobs[0].item(), 0: logprobs[1].item(), 40: logprobs[2].item()}


def test_a_step_where_no_request_asks_for_logprobs_samples_the_same_tokens_and_reports_none() -> None:
    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(1))
    quiet = sample_rows(_parts(), logits, [(i, _state(i, SamplingParams())) for i in range(3)])  # type: ignore[arg-type]
    asked = [(i, _state(i, SamplingParams(logprobs=True))) for i in range(3)]
    loud = sample_rows(_parts(), logits, asked)  # type: ignore[arg-type]
    assert quiet.tokens == loud.tokens and quiet.logprobs == {} and len(loud.logprobs) == 3


def test_every_row_in_order_samples_without_changing_the_runners_logits() -> None:
    # float32 logits of every row, in order, are sampled without a copy: a penalty must not write into them
    logits = torch.tensor([[0.0, 4.0, 3.0], [0.0, 4.0, 3.0]])
    before = logits.clone()
    penalised = _state(1, SamplingParams(repetition_penalty=2.0, logprobs=True))
    penalised.seq.prompt_token_ids = [1]  # token 1 is in the prompt: 4.0 becomes 2.0, below token 2's 3.0
    sampled = sample_rows(_parts(), logits, [(0, _state(0, SamplingParams())), (1, penalised)])  # type: ignore[arg-type]
    assert sampled.tokens == {0: 1, 1: 2}
    assert torch.equal(logits, before)
    assert sampled.logprobs[1] == torch.log_softmax(before[1], -1)[2].item()  # raw logits' logprob, as vLLM reports
