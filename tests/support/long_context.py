"""A random Llama with a long context, whose prefill takes long enough for a prefix-cache hit to show in TTFT."""

from __future__ import annotations

from pathlib import Path


def save_long_context_llama(folder: Path, hidden: int = 128, layers: int = 4, context: int = 1024) -> Path:
    """A random Llama (seed 0, the zoo's character tokenizer, `context` positions) saved as safetensors in
    `folder` (kept when it is already there); returns `folder`."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from servegate.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def long_context_manifest(weights: Path, scope: str, **quality: object) -> dict[str, object]:
    """A continuous-batching manifest on that model with a prefix cache of `scope`, tenants from X-Tenant and
    prompts up to 900 tokens; `quality` adds to its quality section (8 recall items for the probes)."""
    return {
        "name": "long-context",
        "weights": {"source": str(weights)},
        "preprocess": {"chat_template": "none", "max_input_tokens": 900, "tenant_from": "header"},
        "runtime": {
            "max_model_len": 1024,
            "threads": 1,
            "kv_cache": {"block_size": 16, "memory_budget": "64MiB", "prefix_caching": True, "cache_scope": scope},
        },
        "batching": {"mode": "continuous", "max_batch_size": 4, "max_num_batched_tokens": 1024},
        "postprocess": {"max_output_tokens": 16},
        "quality": {"suites": [{"name": "recall", "dataset": "zoo:recall", "limit": 8, "max_tokens": 4}], **quality},
    }
