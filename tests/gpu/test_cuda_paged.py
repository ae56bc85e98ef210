"""Paged attention, the prefix cache, preemption and the fp8 KV pool on CUDA, on the random 1.1B Llama in float32."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from cuda_cases import (
    BLOCK,
    DEVICE,
    IdsOnly,
    gpu,
    hf_greedy,
    id_manifest,
    id_requests,
    next_logits,
    random_llama,
    run_engine,
)

from servegate.runtime.model.model_runner import PagedModelRunner, bytes_per_token_of
from servegate.runtime.types import SeqChunk

pytestmark = gpu


@pytest.fixture(scope="module")
def model() -> Any:
    """The random 1.1B Llama in float32 on the GPU."""
    return random_llama(torch.float32)


def ragged_step(vocab: int) -> tuple[list[list[int]], list[SeqChunk], list[list[int]]]:
    """Three sequences in one step: a fresh prefill on consecutive blocks, the second half of a prefill on
    scattered blocks (its first half cached in an earlier step), and a one-token decode on scattered blocks.
    Returns (full token ids per sequence, the step's chunks, the earlier step's chunks)."""
    gen = torch.Generator().manual_seed(3)
    a, b, c = (torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (37, 41, 30))
    table_a, table_b, table_c = (0, 1, 2), (9, 4, 7), (12, 5)
    earlier = [SeqChunk(1, tuple(b[:20]), 0, table_b), SeqChunk(2, tuple(c[:-1]), 0, table_c)]
    step = [
        SeqChunk(0, tuple(a), 0, table_a),
        SeqChunk(1, tuple(b[20:]), 20, table_b),
        SeqChunk(2, (c[-1],), len(c) - 1, table_c),
    ]
    return [a, b, c], step, earlier


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_a_ragged_paged_step_on_cuda_gives_the_models_own_logits(model: Any, kv_dtype: str) -> None:
    runner = PagedModelRunner(model, num_blocks=16, block_size=BLOCK, kv_dtype=kv_dtype)
    assert runner.device.type == DEVICE and runner.cache.keys[0].device.type == DEVICE
    full, step, earlier = ragged_step(model.config.vocab_size)
    runner.execute(earlier)
    logits = runner.execute(step)
    expected = torch.stack([next_logits(model, ids) for ids in full])
    assert logits.device.type == DEVICE and logits.dtype == torch.float32
    if kv_dtype == "auto":
        assert torch.get_float32_matmul_precision() == "highest"  # no TF32: float32 products are float32
        # another batch shape is another cuBLAS kernel: float32 rounding differs far below 1e-3; a wrong slot,
        # block or mask moves logits by whole units
        torch.testing.assert_close(logits, expected, rtol=1e-3, atol=1e-3)
    else:  # KV rows rounded to float8 e4m3 (3 mantissa bits): close, not equal, and a quarter of the bytes
        assert runner.cache.keys[0].dtype == torch.uint8
        assert bytes_per_token_of(model, "fp8") * 4 == bytes_per_token_of(model, "auto")
        cosine = torch.nn.functional.cosine_similarity(logits, expected, dim=-1)
        assert bool((cosine > 0.99).all()), cosine


def engine_case(model: Any, served: Any, requests: list) -> Any:
    ids = IdsOnly()
    return run_engine(served, requests, model=model, tokenizer=ids, preprocessor=ids)


def test_prefix_cache_hits_on_cuda_and_keeps_outputs_equal(model: Any) -> None:
    requests = id_requests(16, model.config.vocab_size, seed=5, shared_prefix=3 * BLOCK)
    expected = [hf_greedy(model, r.prompt_token_ids, r.params.max_tokens) for r in requests]
    served = id_manifest(
        runtime={"kv_cache": {"block_size": BLOCK, "memory_budget": "256MiB", "prefix_caching": True}},
        batching={"mode": "continuous", "max_batch_size": 4},
    )
    run = engine_case(model, served, requests)
    assert run.outputs == expected
    # 3 shared full blocks per request; the first batch's prompts are computed together and cannot hit
    assert run.stats.prefix_cache_hits >= (16 - 4) * 3


def test_preemption_under_a_small_kv_budget_on_cuda_keeps_outputs_equal(model: Any) -> None:
    requests = id_requests(16, model.config.vocab_size, seed=6, max_tokens=24)
    expected = [hf_greedy(model, r.prompt_token_ids, r.params.max_tokens) for r in requests]
    max_len = 128
    # room for one longest sequence and 3 blocks more: 8 requests of up to 64 tokens cannot all stay
    budget = (max_len // BLOCK + 3) * BLOCK * bytes_per_token_of(model)
    served = id_manifest(max_model_len=max_len, kv_budget=budget, batching={"mode": "continuous", "max_batch_size": 8})
    run = engine_case(model, served, requests)
    assert run.outputs == expected
    assert run.stats.preemptions > 0
    assert run.stats.kv_blocks_used == 0


def test_an_fp8_kv_pool_on_cuda_serves_every_request_in_a_quarter_of_the_bytes(model: Any) -> None:
    requests = id_requests(8, model.config.vocab_size, seed=7)
    served = id_manifest(runtime={"kv_cache": {"block_size": BLOCK, "memory_budget": "64MiB", "dtype": "fp8"}})
    run = engine_case(model, served, requests)
    assert all(1 <= len(o) <= r.params.max_tokens for o, r in zip(run.outputs, requests, strict=True))
    assert all(isinstance(t, int) for o in run.outputs for t in o)
