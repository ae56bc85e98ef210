"""KV-cache memory arithmetic: the runtime sizes its block pool with it, the capacity planner plans with it.

M_KV per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element
(MLA models cache one compressed latent per token: layers x (kv_lora_rank + qk_rope_head_dim) x bytes)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8": 1, "int8": 1}
"""Bytes per element of the dtypes a KV cache or weights can be stored in."""


@dataclass(frozen=True)
class KVDims:
    """The attention shape that decides KV-cache size."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    mla_latent_dim: int | None = None
    """kv_lora_rank + qk_rope_head_dim for multi-head latent attention (DeepSeek-style), else None."""

    def bytes_per_token(self, bytes_per_element: int) -> int:
        """KV bytes one token occupies across all layers."""
        if self.mla_latent_dim is not None:
            return self.num_layers * self.mla_latent_dim * bytes_per_element
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, bytes_per_element)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
    """2 x layers x kv_heads x head_dim x bytes: the K and V entries one token adds to the cache."""
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_element


def kv_dims_from_config(config: Any) -> KVDims:
    """KV dimensions from a Hugging Face config (a PretrainedConfig or the dict of its config.json)."""
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    text = get("text_config")
    if text is not None:  # multimodal wrappers keep the language model's shape in text_config
        return kv_dims_from_config(text)
    layers = get("num_hidden_layers") or get("n_layer") or get("num_layers")
    heads = get("num_attention_heads") or get("n_head")
    if not layers or not heads:
        raise ValueError("config has no num_hidden_layers / num_attention_heads: cannot size the KV cache")
    kv_heads = get("num_key_value_heads") or get("multi_query_group_num") or heads
    if get("multi_query") is True:
        kv_heads = 1
    hidden = get("hidden_size") or get("n_embd") or get("d_model")
    head_dim = get("head_dim") or (hidden // heads if hidden else None)
    if not head_dim:
        raise ValueError("config has neither head_dim nor hidden_size: cannot size the KV cache")
    lora = get("kv_lora_rank")
    latent = int(lora) + int(get("qk_rope_head_dim") or 0) if lora else None
    return KVDims(int(layers), int(kv_heads), int(head_dim), latent)


def num_kv_blocks(memory_budget: int, block_size: int, bytes_per_token: int) -> int:
    """How many KV blocks of `block_size` tokens fit in `memory_budget` bytes."""
    if block_size < 1 or bytes_per_token < 1:
        raise ValueError("block_size and bytes_per_token must be >= 1")
    return memory_budget // (block_size * bytes_per_token)
