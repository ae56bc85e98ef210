"""Penalties, logit_bias, min_p, min_tokens and stop_token_ids: their formulas, their batch invariance, and the
engine's greedy output in every batching mode against transformers' own `generate` with its own processors.

The oracle is independent code: transformers' RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor
and MinNewTokensLengthLogitsProcessor, and a frequency/presence processor written here from vLLM's formula,
listed in vLLM's order (bias and min_tokens, then repetition, frequency and presence).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
import transformers
from runtime_factories import ToyPreprocessor, ToyTokenizer, toy_manifest
from support.manifests import BATCHING_MODES
from test_engine_models import BLOCK, EOS, MAX_LEN, VOCAB, tiny_model

from servegate.runtime.engine.reference import ReferenceEngine
from servegate.runtime.model.logit_processors import TokenHistory, reshape_logits
from servegate.runtime.model.sampling import apply_min_p, request_generator, sample_batch
from servegate.runtime.postprocess import OutputStream
from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams

model_runner = pytest.importorskip("servegate.runtime.model.model_runner")


def test_repetition_frequency_and_presence_follow_vllms_formula() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    history = [TokenHistory(prompt=[0], output=[1, 1, 3])]
    repeated = reshape_logits(logits, [SamplingParams(repetition_penalty=2.0)], history)
    # prompt token 0 and output tokens 1, 3: positive logits halved, negative ones doubled; 2 and 4 untouched
    assert repeated.tolist() == [[1.0, -2.0, 0.5, 1.5, -2.0]]
    counted = reshape_logits(logits, [SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)], history)
    # output counts: token 1 twice, token 3 once; the prompt's token 0 is not counted (vLLM: output only)
    assert counted.tolist() == [[2.0, -1.0 - 1.0 - 0.25, 0.5, 3.0 - 0.5 - 0.25, -2.0]]


def test_logit_bias_and_min_tokens_mask_and_rows_without_them_are_untouched() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    params = [SamplingParams(logit_bias=((0, 5.0),), min_tokens=2), SamplingParams()]
    history = [TokenHistory([1], [1], ending_ids=frozenset({2})), TokenHistory([1], [])]
    out = reshape_logits(logits, params, history)
    assert out[0].tolist() == [6.0, 2.0, float("-inf")]
    assert out[1].tolist() == [1.0, 2.0, 3.0]
    done = reshape_logits(logits, params, [TokenHistory([1], [1, 1], frozenset({2})), history[1]])
    assert done[0].tolist() == [6.0, 2.0, 3.0]  # two tokens generated: EOS may come
    plain = torch.zeros(2, 3)
    assert reshape_logits(plain, [SamplingParams(), SamplingParams()], history) is plain


def test_min_p_drops_tokens_below_its_share_of_the_likeliest() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = apply_min_p(logits, 0.5)  # floor 0.25: 0.5 and 0.3 stay
    assert torch.isfinite(kept).tolist() == [True, True, False, False]
    assert torch.equal(apply_min_p(logits, 0.0), logits)


def test_greedy_picks_the_biased_token_and_reports_the_raw_logprob() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    params = [SamplingParams(logit_bias=((0, 10.0),))]
    reshaped = reshape_logits(logits, params, [TokenHistory([1], [])])
    tokens, _ = sample_batch(reshaped, params, [None])
    assert tokens.tolist() == [0]


def random_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        max_tokens=16,
        presence_penalty=rng.choice([0.0, 0.7, -1.2]),
        frequency_penalty=rng.choice([0.0, 0.4, 1.9]),
        repetition_penalty=rng.choice([1.0, 1.3, 0.8]),
        logit_bias=tuple(sorted({rng.randrange(VOCAB): rng.uniform(-5, 5) for _ in range(rng.randint(0, 3))}.items())),
        min_tokens=rng.choice([0, 0, 3]),
    )


def test_reshaping_a_batch_of_64_equals_reshaping_each_row_alone() -> None:
    rng = random.Random(3)
    logits = torch.randn(64, VOCAB, generator=torch.Generator().manual_seed(3))
    params = [random_params(rng) for _ in range(64)]
    histories = [
        TokenHistory(
            [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))],
            [rng.randrange(VOCAB) for _ in range(rng.randint(0, 20))],
            frozenset({EOS}),
        )
        for _ in range(64)
    ]
    together = reshape_logits(logits, params, histories)
    for row in range(64):
        alone = reshape_logits(logits[row : row + 1], params[row : row + 1], histories[row : row + 1])
        assert torch.equal(together[row], alone[0]), row


def test_sampling_with_min_p_and_penalties_is_the_same_at_any_batch_size() -> None:
    rng = random.Random(5)
    logits = torch.randn(16, VOCAB, generator=torch.Generator().manual_seed(5))
    params = [SamplingParams(temperature=0.9, min_p=0.1, top_k=20, presence_penalty=0.5) for _ in range(16)]
    histories = [TokenHistory([1], [rng.randrange(VOCAB) for _ in range(5)]) for _ in range(16)]
    reshaped = reshape_logits(logits, params, histories)
    together, _ = sample_batch(reshaped, params, [request_generator(i) for i in range(16)])
    for row in range(16):
        alone, _ = sample_batch(reshaped[row : row + 1], params[row : row + 1], [request_generator(row)])
        assert int(alone[0]) == int(together[row])


def test_output_stream_ends_on_a_stop_id_and_looks_for_nothing_before_min_tokens() -> None:
    tokenizer = ToyTokenizer()
    stream = OutputStream(tokenizer, max_tokens=10, stop_token_ids=frozenset({7}), eos_token_ids=frozenset({EOS}))
    stream.add(5)
    assert stream.add(7).finish_reason == "stop"
    assert stream.token_ids == [5, 7] and stream.text == tokenizer.decode([5])
    early = OutputStream(tokenizer, max_tokens=10, stop=(tokenizer.decode([5]),), min_tokens=2)
    assert early.add(5).finish_reason is None  # the stop string inside the first min_tokens tokens is text
    assert early.add(6).finish_reason is None
    assert early.ending_ids() == frozenset()
    assert OutputStream(tokenizer, 4, eos_token_ids=frozenset({EOS}), ignore_eos=True).ending_ids() == frozenset()


class FrequencyPresence(transformers.LogitsProcessor):
    """vLLM's frequency and presence penalties over the generated tokens (the oracle's own code)."""

    def __init__(self, prompt_len: int, frequency: float, presence: float) -> None:
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        out = scores.clone()
        for token in set(input_ids[0, self.prompt_len :].tolist()):
            count = int((input_ids[0, self.prompt_len :] == token).sum())
            out[0, token] -= self.frequency * count + self.presence
        return out


def oracle(model: Any, request: GenerationRequest) -> list[int]:
    """transformers' greedy generate with the request's processors, in vLLM's order."""
    p = request.params
    ids = torch.tensor([request.prompt_token_ids])
    processors: list[Any] = []
    if p.logit_bias:
        processors.append(transformers.SequenceBiasLogitsProcessor({(t,): b for t, b in p.logit_bias}))
    if p.min_tokens:
        processors.append(transformers.MinNewTokensLengthLogitsProcessor(ids.shape[1], p.min_tokens, EOS))
    if p.repetition_penalty != 1.0:
        processors.append(transformers.RepetitionPenaltyLogitsProcessor(p.repetition_penalty))
    if p.frequency_penalty or p.presence_penalty:
        processors.append(FrequencyPresence(ids.shape[1], p.frequency_penalty, p.presence_penalty))
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=p.max_tokens,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=0,
            logits_processor=transformers.LogitsProcessorList(processors),
        )
    return out[0, ids.shape[1] :].tolist()


@pytest.fixture(scope="module")
def shaped_case() -> dict[str, Any]:
    """24 requests, each with its own penalties, bias and min_tokens, and transformers' answers to them."""
    torch.set_num_threads(1)
    model = tiny_model("llama")
    rng = random.Random(11)
    reqs = [
        GenerationRequest(
            f"r{i}",
            prompt_token_ids=[rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 24))],
            params=random_params(rng),
        )
        for i in range(24)
    ]
    return {"model": model, "requests": reqs, "expected": [oracle(model, r) for r in reqs]}


MODES = BATCHING_MODES


@pytest.mark.parametrize("mode", list(MODES))
def test_shaped_greedy_output_equals_transformers_in_every_batching_mode(
    shaped_case: dict[str, Any], mode: str
) -> None:
    sections = {"preprocess": {"max_input_tokens": 64}, **MODES[mode]}
    sections["runtime"] = {"max_model_len": MAX_LEN, **sections.get("runtime", {})}
    runner = model_runner.PagedModelRunner(shaped_case["model"], num_blocks=200, block_size=BLOCK)
    engine = ReferenceEngine(
        toy_manifest(**sections),
        runner=runner,
        tokenizer=ToyTokenizer(),
        preprocessor=ToyPreprocessor(vocab_size=VOCAB),
    )
    try:
        results = engine.generate(shaped_case["requests"])
    finally:
        engine.shutdown_sync()
    got = [list(r.token_ids) if isinstance(r, FinishEvent) else r.error.message for r in results]
    assert got == shaped_case["expected"]
    # the oracle is not trivially the plain greedy answer: the shaping changed some outputs
    plain = [
        GenerationRequest(r.id, prompt_token_ids=r.prompt_token_ids, params=SamplingParams(max_tokens=16))
        for r in shaped_case["requests"]
    ]
    assert [oracle(shaped_case["model"], r) for r in plain[:8]] != shaped_case["expected"][:8]


def test_a_stop_string_is_kept_at_the_end_when_asked_as_vllm_keeps_it() -> None:
    from servegate.runtime.postprocess import cut_at_stop

    assert cut_at_stop("1+1=2 and 3", ("and", "="), keep=True) == ("1+1=", True)
    assert cut_at_stop("1+1=2 and 3", ("and",), keep=True) == ("1+1=2 and", True)
    assert cut_at_stop("1+1=2", ("and",)) == ("1+1=2", False)
    tokenizer = ToyTokenizer()
    stop = tokenizer.decode([6])
    kept = OutputStream(tokenizer, max_tokens=10, stop=(stop,), include_stop=True)
    kept.add(5)
    assert kept.add(6).finish_reason == "stop" and kept.text == tokenizer.decode([5, 6])
    cut = OutputStream(tokenizer, max_tokens=10, stop=(stop,))
    cut.add(5)
    assert cut.add(6).finish_reason == "stop" and cut.text == tokenizer.decode([5])
