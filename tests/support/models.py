"""Tiny random Llamas, in memory or on disk, for tests that need real weights when the zoo's models are not built."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_llama(
    seed: int = 0,
    *,
    vocab_size: int = 101,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    **config: Any,
) -> Any:
    """A random 2-layer float32 Llama (GQA 4/2 heads, untied head unless `config` says otherwise), in eval mode;
    `config` sets any other LlamaConfig field."""
    import torch
    import transformers as hf

    torch.manual_seed(seed)
    settings: dict[str, Any] = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    settings.update(config)
    llama = hf.LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size, **settings
    )
    return hf.LlamaForCausalLM(llama).eval()


def char_llama(seed: int = 0) -> Any:
    """A tiny Llama (hidden 32) over the zoo's character vocabulary, with its special token ids."""
    from servegate.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_char_tokenizer

    return tiny_llama(
        seed,
        vocab_size=len(build_char_tokenizer()),
        hidden_size=32,
        intermediate_size=64,
        max_position_embeddings=256,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )


def save_tiny_llama(folder: Path, seed: int = 0) -> Path:
    """`char_llama(seed)` with the zoo's character tokenizer, saved as safetensors in `folder` (kept when it is
    already there); returns `folder`."""
    if (folder / "config.json").is_file():
        return folder
    from servegate.zoo.tokenizer import build_char_tokenizer

    char_llama(seed).save_pretrained(folder, safe_serialization=True)
    build_char_tokenizer().save_pretrained(folder)
    return folder


def assert_routing_decodes_as_before(route: Any) -> None:
    """`route` (a function rewiring a model's linears in place) leaves tiny_llama's greedy tokens unchanged and
    its logits within float32 rounding."""
    import copy

    import torch

    model = tiny_llama()
    ids = torch.tensor([[5, 9, 2, 44, 17, 3]])
    before = model.generate(ids, max_new_tokens=12, do_sample=False)
    with torch.inference_mode():
        logits_before = model(ids).logits
    routed = copy.deepcopy(model)
    assert route(routed) == 2 * 7 + 1
    assert torch.equal(routed.generate(ids, max_new_tokens=12, do_sample=False), before)
    with torch.inference_mode():
        torch.testing.assert_close(routed(ids).logits, logits_before, rtol=1e-4, atol=1e-5)
