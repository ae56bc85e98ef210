"""Prompt-token log-probabilities of the reference engine: plain transformers' numbers, the manifest's contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from servegate.contracts.loading import load_manifest
from servegate.runtime import build
from servegate.runtime.types import ErrorEvent, GenerationRequest, PromptLogprobs

MANIFEST = """\
apiVersion: servegate/v1
kind: ServedModel
name: scored
weights: {{source: zoo:tiny-primary}}
preprocess: {{chat_template: none, max_input_tokens: 24, truncation: {truncation}}}
runtime: {{max_model_len: 128, kv_cache: {{block_size: 16, memory_budget: 1MiB}}{quant}}}
batching: {{mode: continuous, max_batch_size: 8}}
postprocess: {{max_output_tokens: 16}}
"""
TEXTS = ["796+439=1235", "key=ABCD; code: ABCD", " 685+778=1463"]


def engine_for(tmp_path: Path, truncation: str = "left", quant: str = "") -> Any:
    path = tmp_path / f"{truncation}{quant != ''}.yaml"
    path.write_text(MANIFEST.format(truncation=truncation, quant=quant), encoding="utf-8")
    engine = build(load_manifest(path))
    engine.start_sync()
    return engine


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The zoo model and tokenizer loaded by plain transformers (float32, eager)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from servegate.zoo.catalog import zoo_model_path

    folder = zoo_model_path("tiny-primary")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder)


def reference_logprobs(plain: Any, ids: list[int]) -> list[float]:
    model, _ = plain
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return [logp[i - 1, ids[i]].item() for i in range(1, len(ids))]


def test_prompt_logprobs_equal_plain_transformers(tmp_path: Path, plain: Any) -> None:
    engine = engine_for(tmp_path)
    try:
        assert engine.scores_prompts
        results = engine.score([GenerationRequest(id=str(i), prompt=t) for i, t in enumerate(TEXTS)])
    finally:
        engine.shutdown_sync()
    _, tokenizer = plain
    for text, result in zip(TEXTS, results, strict=True):
        assert isinstance(result, PromptLogprobs) and result.truncated_tokens == 0
        ids = tokenizer(text)["input_ids"]
        assert list(result.token_ids) == ids and result.logprobs[0] is None
        expected = reference_logprobs(plain, ids)
        assert max(abs(a - b) for a, b in zip(result.logprobs[1:], expected, strict=True)) < 1e-4
        with torch.no_grad():
            argmax = plain[0](torch.tensor([ids])).logits[0].argmax(-1).tolist()
        assert list(result.greedy[1:]) == [argmax[i - 1] == ids[i] for i in range(1, len(ids))]
        for position in range(1, len(ids)):  # the top token and its log-probability, as lm-eval compares them
            ((best, value),) = result.top[position].items()
            assert best == argmax[position - 1] and value >= result.logprobs[position]
            assert (value == result.logprobs[position]) == result.greedy[position]


def test_the_manifest_truncation_and_quantization_apply(tmp_path: Path, plain: Any) -> None:
    long = "filler words " * 10 + "796+439=1235"
    left, right = engine_for(tmp_path, "left"), engine_for(tmp_path, "reject")
    quantized = engine_for(tmp_path, "left", ", quantization: {method: int2-weight}")
    try:
        kept = left.score([GenerationRequest(id="l", prompt=long)])[0]
        refused = right.score([GenerationRequest(id="r", prompt=long)])[0]
        short = [GenerationRequest(id="q", prompt=TEXTS[0])]
        exact, low_bit = left.score(short)[0], quantized.score(short)[0]
    finally:
        for engine in (left, right, quantized):
            engine.shutdown_sync()
    _, tokenizer = plain
    ids = tokenizer(long)["input_ids"]
    assert isinstance(kept, PromptLogprobs) and len(kept.token_ids) == 24 and kept.truncated_tokens == len(ids) - 24
    assert list(kept.token_ids) == ids[:1] + ids[len(ids) - 23 :]  # left truncation keeps BOS and the tail
    assert (
        max(abs(a - b) for a, b in zip(kept.logprobs[1:], reference_logprobs(plain, list(kept.token_ids)), strict=True))
        < 1e-4
    )
    assert isinstance(refused, ErrorEvent) and refused.error.code == "input_too_long"
    assert isinstance(low_bit, PromptLogprobs) and low_bit.token_ids == exact.token_ids
    assert (
        max(abs(a - b) for a, b in zip(low_bit.logprobs[1:], exact.logprobs[1:], strict=True)) > 1e-3
    )  # int2 weights scored


def test_scoring_runs_between_generation_steps(tmp_path: Path) -> None:
    engine = engine_for(tmp_path)
    try:
        import threading

        generated: list[Any] = []
        worker = threading.Thread(
            target=lambda: generated.extend(
                engine.generate([GenerationRequest(id=f"g{i}", prompt=t) for i, t in enumerate(TEXTS * 4)])
            )
        )
        worker.start()
        scored = [engine.score([GenerationRequest(id="s", prompt=TEXTS[0])])[0] for _ in range(5)]
        worker.join(timeout=60)
    finally:
        engine.shutdown_sync()
    assert len(generated) == 12 and all(not isinstance(r, ErrorEvent) for r in generated)
    assert all(s.logprobs == scored[0].logprobs for s in scored)
