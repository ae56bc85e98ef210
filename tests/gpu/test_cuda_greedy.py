"""On CUDA, every batching mode's greedy output equals transformers' own greedy `generate` (cuda_cases.py
says how equality is defined in float32 and in bfloat16), on a random ~1.1B Llama and on the zoo models."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from cuda_cases import (
    BF16_MIN_EXACT,
    DEVICE,
    MODES,
    REHEARSAL,
    IdsOnly,
    bf16_problems,
    gpu,
    hf_greedy,
    id_manifest,
    id_requests,
    parameters_b,
    random_llama,
    run_engine,
)

from servegate.runtime.types import GenerationRequest, SamplingParams

pytestmark = gpu
ROOT_MANIFEST = "examples/quickstart/manifest.yaml"


@pytest.fixture(scope="module")
def llama_fp32() -> dict[str, Any]:
    """The random 1.1B Llama in float32, 16 requests, and transformers' greedy tokens for each."""
    model = random_llama(torch.float32)
    assert REHEARSAL or 1.0 < parameters_b(model) < 1.3
    requests = id_requests(16, model.config.vocab_size, seed=1)
    expected = [hf_greedy(model, r.prompt_token_ids, r.params.max_tokens) for r in requests]
    return {"model": model, "requests": requests, "expected": expected}


@pytest.fixture(scope="module")
def llama_bf16(llama_fp32: dict[str, Any]) -> dict[str, Any]:
    """The same weights rounded to bfloat16, with transformers' bfloat16 greedy tokens."""
    model = random_llama(torch.bfloat16)
    requests = llama_fp32["requests"]
    expected = [hf_greedy(model, r.prompt_token_ids, r.params.max_tokens) for r in requests]
    return {"model": model, "requests": requests, "expected": expected}


def engine_tokens(case: dict[str, Any], mode: str, **manifest: Any) -> Any:
    served = id_manifest(**{**MODES[mode], **manifest})
    ids = IdsOnly()
    return run_engine(served, case["requests"], model=case["model"], tokenizer=ids, preprocessor=ids)


@pytest.mark.parametrize("mode", list(MODES))
def test_float32_greedy_of_every_mode_equals_transformers_token_for_token(llama_fp32: dict, mode: str) -> None:
    assert torch.get_float32_matmul_precision() == "highest"  # no TF32: float32 products are float32
    run = engine_tokens(llama_fp32, mode)
    assert run.device.type == DEVICE
    assert run.outputs == llama_fp32["expected"]
    assert run.stats.kv_blocks_used == 0


@pytest.mark.parametrize("mode", list(MODES))
def test_bfloat16_greedy_of_every_mode_is_bf16_equal_to_transformers(llama_bf16: dict, mode: str) -> None:
    run = engine_tokens(llama_bf16, mode)
    prompts = [r.prompt_token_ids for r in llama_bf16["requests"]]
    problems, exact = bf16_problems(llama_bf16["model"], prompts, run.outputs, llama_bf16["expected"])
    print(f"bf16 {mode}: {exact:.0%} of requests token for token equal to transformers")
    assert not problems, problems
    assert exact >= BF16_MIN_EXACT


def test_bfloat16_mode_none_gives_the_same_tokens_twice(llama_bf16: dict) -> None:
    first, second = engine_tokens(llama_bf16, "none"), engine_tokens(llama_bf16, "none")
    assert first.outputs == second.outputs


def test_bfloat16_modes_are_bf16_equal_to_each_other(llama_bf16: dict) -> None:
    prompts = [r.prompt_token_ids for r in llama_bf16["requests"]]
    alone = engine_tokens(llama_bf16, "none").outputs
    for mode in ("static", "continuous", "offline"):
        problems, exact = bf16_problems(llama_bf16["model"], prompts, engine_tokens(llama_bf16, mode).outputs, alone)
        print(f"bf16 {mode} vs none: {exact:.0%} of requests token for token equal")
        assert not problems, (mode, problems)


# --- the zoo's trained tiny models, loaded from a manifest onto the GPU ----------------------------------


ZOO_PROMPTS = ["12+34=", "7+85=", "999+1=", "code: KQZ. recall the code:", '{"a": 1, "b": ', "user: hi\nassistant:"]


def zoo_sets(zoo: str, mode: str, dtype: str) -> list[str]:
    """`--set` overrides of the quickstart: the zoo model on CUDA, unquantized, batched as MODES[mode] says."""
    sets = [f"weights.source=zoo:{zoo}", "weights.sha256={}", f"runtime.device={DEVICE}", f"runtime.dtype={dtype}"]
    sets += ["runtime.quantization={method: none}", "runtime.warmup=[]", "postprocess.response_cache.enabled=false"]
    sets += ["failure_policy.fallback=null"]
    sections = MODES[mode]
    if "kv_cache" in sections.get("runtime", {}):
        sets.append("runtime.kv_cache=null")
    elif sections["batching"]["mode"] != "continuous":  # the quickstart's prefix cache needs continuous batching
        sets.append("runtime.kv_cache.prefix_caching=false")
    sets += [f"batching.{key}={value}" for key, value in sections["batching"].items()]
    return sets


def zoo_engine_and_reference(zoo: str, mode: str, dtype: str) -> tuple[list[list[int]], list[list[int]], Any]:
    """(the engine's tokens, transformers' greedy tokens, the reference model) for ZOO_PROMPTS on CUDA."""
    from servegate.contracts.loading import load_manifest
    from servegate.runtime.engine.reference import ReferenceEngine

    served = load_manifest(ROOT_MANIFEST, zoo_sets(zoo, mode, dtype), check_fallback=False)
    requests = [
        GenerationRequest(f"z{i}", prompt=p, params=SamplingParams(max_tokens=12)) for i, p in enumerate(ZOO_PROMPTS)
    ]
    engine = ReferenceEngine(served)
    engine.start_sync()
    try:
        assert engine.parts.device.type == DEVICE
        prompts = [list(engine.parts.preprocessor.encode(r).token_ids) for r in requests]
        results = engine.generate(requests)
    finally:
        engine.shutdown_sync()
    reference, expected = zoo_reference(zoo, dtype, tuple(tuple(p) for p in prompts))
    return [list(getattr(r, "token_ids", [str(r)])) for r in results], expected, (reference, prompts)


@functools.cache
def zoo_reference(zoo: str, dtype: str, prompts: tuple[tuple[int, ...], ...]) -> tuple[Any, list[list[int]]]:
    """The zoo model loaded by transformers onto the device, and its greedy tokens for each prompt."""
    from transformers import AutoModelForCausalLM

    from servegate.zoo import zoo_model_path

    reference = AutoModelForCausalLM.from_pretrained(zoo_model_path(zoo), dtype=getattr(torch, dtype))
    reference = reference.to(DEVICE).eval()
    eos = reference.generation_config.eos_token_id
    return reference, [hf_greedy(reference, list(p), 12, eos) for p in prompts]


ZOO_CASES = [("tiny-primary", mode) for mode in MODES] + [("tiny-fallback", "none"), ("tiny-fallback", "continuous")]


@pytest.mark.parametrize(("zoo", "mode"), ZOO_CASES)
def test_zoo_model_greedy_on_cuda_equals_transformers_in_float32(zoo: str, mode: str) -> None:
    got, expected, _ = zoo_engine_and_reference(zoo, mode, "float32")
    assert got == expected


@pytest.mark.parametrize("mode", ["none", "continuous"])
def test_zoo_model_greedy_on_cuda_is_bf16_equal_to_transformers_in_bfloat16(mode: str) -> None:
    got, expected, (reference, prompts) = zoo_engine_and_reference("tiny-primary", mode, "bfloat16")
    problems, exact = bf16_problems(reference, prompts, got, expected)
    print(f"zoo bf16 {mode}: {exact:.0%} of requests token for token equal to transformers")
    assert not problems, problems
    assert exact >= BF16_MIN_EXACT


def test_seeded_sampling_on_cuda_does_not_depend_on_the_batch(llama_fp32: dict[str, Any]) -> None:
    """Each request draws from its own torch.Generator on the GPU: the same seed gives the same tokens alone
    (mode none) and batched (continuous), and the same tokens again."""
    requests = [
        GenerationRequest(
            f"s{i}",
            prompt_token_ids=r.prompt_token_ids,
            params=SamplingParams(max_tokens=12, temperature=0.8, top_p=0.95, top_k=50, seed=1000 + i),
        )
        for i, r in enumerate(llama_fp32["requests"][:8])
    ]
    case = {**llama_fp32, "requests": requests}
    alone, batched, again = (engine_tokens(case, mode) for mode in ("none", "continuous", "continuous"))
    assert alone.outputs == batched.outputs == again.outputs
    assert len({tuple(o) for o in alone.outputs}) > 1
