"""KV bytes per token, weight bytes and concurrent sequences from configs written here (no download)."""

from __future__ import annotations

import json

import pytest

from servegate.capacity.memory.plan import plan_memory
from servegate.capacity.memory.weights import read_config, weights_memory
from servegate.runtime.model.kv_memory import DTYPE_BYTES, kv_dims_from_config

LLAMA2_7B = {
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
LLAMA3_8B = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}
MISTRAL_7B = {
    "model_type": "mistral",
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "sliding_window": 4096,
}
# Falcon-7B: multi-query attention, one K/V head shared by 71 query heads of dimension 64.
FALCON_7B_MQA = {
    "model_type": "falcon",
    "hidden_size": 4544,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "multi_query": True,
    "vocab_size": 65024,
}
# DeepSeek-V2-Lite: multi-head latent attention caches kv_lora_rank + qk_rope_head_dim per token and layer.
DEEPSEEK_V2_LITE_MLA = {
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 27,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
}


def kv_per_token(config: dict, dtype: str = "float16") -> int:
    return kv_dims_from_config(config).bytes_per_token(DTYPE_BYTES[dtype])


def test_llama2_7b_fp16_kv_is_half_a_mebibyte_per_token() -> None:
    # 2 (K,V) x 32 layers x 32 heads x 128 dims x 2 bytes
    assert kv_per_token(LLAMA2_7B) == 524_288


def test_llama3_8b_gqa_stores_eight_kv_heads() -> None:
    # 2 x 32 layers x 8 KV heads x 128 dims x 2 bytes: a quarter of Llama-2's
    assert kv_per_token(LLAMA3_8B) == 131_072


def test_mistral_7b_gqa() -> None:
    assert kv_per_token(MISTRAL_7B) == 2 * 32 * 8 * 128 * 2 == 131_072


def test_mqa_model_stores_one_kv_head() -> None:
    # head_dim = 4544 / 71 = 64; one K/V head: 2 x 32 x 1 x 64 x 2
    assert kv_per_token(FALCON_7B_MQA) == 8_192


def test_mla_model_caches_the_compressed_latent() -> None:
    # 27 layers x (512 + 64) x 2 bytes, no factor 2: one latent, not a K and a V
    assert kv_per_token(DEEPSEEK_V2_LITE_MLA) == 27 * 576 * 2 == 31_104


def test_fp8_kv_halves_fp16() -> None:
    assert kv_per_token(LLAMA3_8B, "fp8") * 2 == kv_per_token(LLAMA3_8B, "float16")


def test_llama2_weights_counted_from_config_alone() -> None:
    w = weights_memory(LLAMA2_7B, "float16")
    assert w.parameters == 6_738_415_616  # the published Llama-2-7B parameter count
    assert w.bytes == 2 * 6_738_415_616
    int8 = weights_memory(LLAMA2_7B, "float16", "int8-weight")
    int4 = weights_memory(LLAMA2_7B, "float16", "int4-weight", group_size=32)
    assert int4.bytes < int8.bytes < w.bytes
    # linear weights: 1 byte each plus a 2-byte scale per output row; embeddings and lm_head stay fp16
    linear = int8.quantized_parameters
    assert linear == 6_738_415_616 - 2 * 32000 * 4096 - (2 * 32 + 1) * 4096
    assert int8.bytes == linear + 2 * (6_738_415_616 - linear) + 2 * (32 * (3 * 4096 + 4096 + 2 * 11008 + 4096))
    # what a compiled decode graph copies: the linear layers and the LM head, not embeddings or norms
    assert w.linear_bytes == 2 * (linear + 32000 * 4096)


def test_simulated_quantization_saves_no_memory() -> None:
    tiny = {**LLAMA2_7B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 4, "vocab_size": 100}  # fmt: skip
    assert weights_memory(tiny, "float32", "int2-weight").bytes == weights_memory(tiny, "float32").bytes
    assert weights_memory(tiny, "float32", "int2-weight").simulated


def test_max_concurrent_sequences_for_a_budget() -> None:
    plan = plan_memory(
        LLAMA2_7B, context_tokens=4096, memory_budget=80 * 2**30, dtype="float16", runtime_overhead=2 * 2**30
    )
    kv_pool = 80 * 2**30 - 2 * 6_738_415_616 - 2 * 2**30
    blocks = kv_pool // (16 * 524_288)
    assert plan.kv_pool_bytes == kv_pool
    assert plan.num_kv_blocks == blocks == 8377
    assert plan.blocks_per_sequence == 4096 // 16
    assert plan.max_concurrent_sequences == blocks // 256 == 32
    # GQA stores 4x less per token: four times the sequences (minus the larger weights)
    gqa = plan_memory(
        LLAMA3_8B, context_tokens=4096, memory_budget=80 * 2**30, dtype="float16", runtime_overhead=2 * 2**30
    )
    assert gqa.max_concurrent_sequences > 3 * plan.max_concurrent_sequences


def test_budget_too_small_for_the_weights_is_an_infeasible_plan_with_its_shortfall() -> None:
    plan = plan_memory(LLAMA2_7B, context_tokens=4096, memory_budget=8 * 2**30, dtype="float16", runtime_overhead=0)
    one_sequence = 4096 * 524_288
    assert (plan.kv_pool_bytes, plan.max_concurrent_sequences, plan.fits) == (0, 0, False)
    assert plan.shortfall_bytes == 2 * 6_738_415_616 + one_sequence - 8 * 2**30
    assert plan.as_dict()["shortfall_bytes"] == plan.shortfall_bytes
    assert "does not hold the weights (12.55 GiB) and runtime overhead (0 B): it is" in str(plan.shortfall())
    # room for the weights but not for one sequence at the context: infeasible too, and said so
    tight = plan_memory(LLAMA2_7B, context_tokens=4096, memory_budget=13 * 2**30, dtype="float16", runtime_overhead=0)
    assert (
        tight.max_concurrent_sequences == 0 and tight.shortfall_bytes == 2 * 6_738_415_616 + one_sequence - 13 * 2**30
    )
    assert "and one sequence of 4,096 tokens" in str(tight.shortfall())
    roomy = plan_memory(LLAMA2_7B, context_tokens=4096, memory_budget=80 * 2**30, dtype="float16", runtime_overhead=0)
    assert roomy.shortfall_bytes == 0 and roomy.shortfall() is None


def test_read_config_reads_a_directory(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(MISTRAL_7B))
    assert read_config(tmp_path)["num_key_value_heads"] == 8
    with pytest.raises(FileNotFoundError):
        read_config(tmp_path / "missing")
