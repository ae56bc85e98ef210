"""Models, requests, references and engine set-ups of the CUDA-path tests (tests/gpu).

Two kinds of model: the zoo's trained tiny models, loaded from a manifest exactly as `gate serve` loads them
(runtime.device: cuda), and a random ~1.1B-parameter Llama built on the GPU from a seeded LlamaConfig (the
shape of TinyLlama-1.1B: hidden 2048, 22 layers, 32 query and 4 KV heads, vocab 32000).

How equality is defined (the tests assert these, and say which in their names):

- float32: every batching mode's greedy tokens equal transformers' own unbatched greedy `generate` on the
  same device, token for token (TF32 stays off: torch's default for float32 products).
- bfloat16: a batch changes the shapes of the products, so their rounding, so a bfloat16 logit can move by a
  few units in the last place with what else is in the batch; where two tokens are that close, greedy may
  pick either, and the outputs differ from there on. bfloat16-equal therefore means: token for token, or
  the first difference falls on a near tie, where the reference's own logits of the two tokens differ by
  less than BF16_TIE_LOGITS (so a wrong block table, a stale KV row or a mask error, which move logits by
  far more, still fail). On top of that rule, at least BF16_MIN_EXACT of the requests must match
  transformers token for token (the declared agreement rate), and a mode run twice on the same requests with
  the same batch composition (mode none: one request per step) gives the same tokens both times.

SERVEGATE_GPU_REHEARSAL=1 runs the same tests on the CPU with a small random Llama in place of the 1.1B one
(a check of the tests themselves on a machine without a GPU; the figures and the kernels are not the GPU's).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from support.manifests import served_model

from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.reference import ReferenceEngine
from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams

REHEARSAL = os.environ.get("SERVEGATE_GPU_REHEARSAL") == "1"
DEVICE = "cpu" if REHEARSAL else "cuda"
"""The device the tests run on: CUDA, or the CPU in a rehearsal."""
needs_cuda = pytest.mark.skipif(not REHEARSAL and not torch.cuda.is_available(), reason="torch sees no CUDA device")
gpu = [pytest.mark.gpu, needs_cuda]
"""Marks for a CUDA-path test: in the `gpu` selection, skipped without CUDA."""

BF16_TIE_LOGITS = 0.125
"""A first difference at which the reference's logits of the two tokens are closer than this is a near tie
(8 bfloat16 steps at magnitude 2-4; a random Llama's logits spread over about +-4)."""
BF16_MIN_EXACT = 0.5
"""Share of requests whose bfloat16 tokens must equal transformers' token for token (declared, not measured:
no GPU was at hand when it was set; the GPU check's junit output records the measured share)."""
LLAMA_1B = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "eos_token_id": 2,
    "bos_token_id": 1,
    "pad_token_id": 0,
}
SMALL_LLAMA = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""What a rehearsal builds instead of the 1.1B shape."""
EOS = 2
BLOCK = 16


def random_llama(dtype: torch.dtype, **overrides: Any) -> Any:
    """The seeded random ~1.1B Llama (LLAMA_1B, with `overrides`), built on the GPU in `dtype`, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**{**LLAMA_1B, **(SMALL_LLAMA if REHEARSAL else {}), **overrides})
    with torch.device(DEVICE):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def parameters_b(model: Any) -> float:
    """Parameters, in billions."""
    return sum(p.numel() for p in model.parameters()) / 1e9


class IdsOnly:
    """Preprocessor and tokenizer for token-id requests: ids pass through, text is one letter per token."""

    eos_token_id = EOS
    all_special_ids = [0, 1, 2]
    vocab_size = 2**31  # ids pass through: the model runner bounds them by its embeddings

    def encode(self, request: GenerationRequest) -> Any:
        """The request's own ids, nothing truncated."""
        return SimpleNamespace(token_ids=list(request.prompt_token_ids or []), truncated_tokens=0)

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        """One letter per id (the tests compare ids, not text)."""
        return "".join("abcdefghij"[int(i) % 10] for i in ids)


def id_requests(n: int, vocab: int, seed: int, shared_prefix: int = 0, max_tokens: int = 16) -> list[GenerationRequest]:
    """n token-id requests with prompts of 1-40 tokens after `shared_prefix` common ones, 1-max_tokens outputs."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(shared_prefix)]
    out = []
    for i in range(n):
        prompt = prefix + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 40))]
        params = SamplingParams(max_tokens=rng.randint(1, max_tokens))
        out.append(GenerationRequest(f"r{i}", prompt_token_ids=prompt, params=params))
    return out


@torch.inference_mode()
def hf_greedy(model: Any, prompt: list[int], max_tokens: int, eos: int | None = EOS) -> list[int]:
    """transformers' own greedy `generate` of one unpadded prompt on the model's device."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, ids.shape[1] :].tolist()  # type: ignore[no-any-return]


@torch.inference_mode()
def next_logits(model: Any, ids: list[int]) -> torch.Tensor:
    """float32 logits [vocab] of the model's next token after `ids` (plain forward, no cache)."""
    batch = torch.tensor([ids], device=model.device)
    return model(batch, attention_mask=torch.ones_like(batch)).logits[0, -1].float()


MODES: dict[str, dict[str, Any]] = {
    "none": {"batching": {"mode": "none"}, "runtime": {"kv_cache": None}},
    "static": {"batching": {"mode": "static", "max_batch_size": 6, "max_wait_ms": 2}, "runtime": {"kv_cache": None}},
    "dynamic": {"batching": {"mode": "dynamic", "max_batch_size": 6, "max_wait_ms": 2}, "runtime": {"kv_cache": None}},
    "continuous": {"batching": {"mode": "continuous", "max_batch_size": 8}},
    "offline": {"batching": {"mode": "offline", "max_batch_size": 8}},
    "chunked": {"batching": {"mode": "continuous", "max_num_batched_tokens": 16, "chunked_prefill": True}},
}
"""Manifest sections of each batching set-up the greedy tests run (over id_manifest's defaults)."""


def id_manifest(max_model_len: int = 128, kv_budget: int | str = "64MiB", **sections: Any) -> ServedModel:
    """A manifest for token-id requests on CUDA (its weights are never loaded: tests hand the engine a model)."""
    data: dict[str, Any] = {
        "name": "gpu-test",
        "weights": {"source": "zoo:tiny-primary"},
        "preprocess": {"max_input_tokens": max_model_len - 32},
        "postprocess": {"max_output_tokens": 32},
        "runtime": {
            "device": DEVICE,
            "max_model_len": max_model_len,
            "kv_cache": {"block_size": BLOCK, "memory_budget": kv_budget},
        },
        "batching": {"mode": "continuous", "max_batch_size": 8, "max_num_batched_tokens": 512},
        "failure_policy": {"request_timeout_s": 600, "max_queue": 10_000},
    }
    return served_model(data, **sections)


@dataclass
class EngineRun:
    """What an engine produced for a list of requests."""

    outputs: list[list[int]]
    """Token ids per request (an error message instead, as a one-item list of str, when one failed)."""
    stats: Any
    device: Any


def run_engine(served: ServedModel, requests: list[GenerationRequest], **parts: Any) -> EngineRun:
    """Start an engine (with the given parts, e.g. model=, or from the manifest), run `requests`, shut it down."""
    engine = ReferenceEngine(served, **parts)
    try:
        results = engine.generate(requests)
        stats, device = engine.stats(), engine.parts.device if engine.parts is not None else None
    finally:
        engine.shutdown_sync()
    outputs = [list(r.token_ids) if isinstance(r, FinishEvent) else [r.error.message] for r in results]
    return EngineRun(outputs, stats, device)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where a and b differ (a length difference counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def bf16_problems(
    model: Any, prompts: list[list[int]], got: list[list[int]], expected: list[list[int]]
) -> tuple[list[str], float]:
    """(the requests whose first difference is not a near tie, the share of requests equal token for token)."""
    problems, exact = [], 0
    for i, (prompt, g, e) in enumerate(zip(prompts, got, expected, strict=True)):
        at = first_difference(g, e)
        if at is None:
            exact += 1
            continue
        if at >= len(g) or at >= len(e) or not isinstance(g[at], int):
            problems.append(f"request {i}: lengths {len(g)} vs {len(e)} (one stopped early: {g[:3]}...)")
            continue
        logits = next_logits(model, prompt + e[:at])
        gap = abs(float(logits[e[at]] - logits[g[at]]))
        if gap >= BF16_TIE_LOGITS:
            problems.append(f"request {i} at token {at}: {g[at]} vs {e[at]}, logit gap {gap:.3f}")
    return problems, exact / max(1, len(prompts))
