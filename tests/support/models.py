"""A tiny random Llama on disk, for tests that need real weights when the zoo's models are not built."""

from __future__ import annotations

from pathlib import Path


def save_tiny_llama(folder: Path) -> Path:
    """A random Llama (2 layers, hidden 32, seed 0) with the zoo's character tokenizer, saved as safetensors in
    `folder` (kept when it is already there); returns `folder`."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from servegate.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder
