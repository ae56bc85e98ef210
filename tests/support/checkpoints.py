"""Quantized checkpoints in compressed-tensors' own format, made here from a safetensors folder.

llm-compressor's builds (`make checkpoints`) are the real thing and take minutes; these are round-to-nearest
builds written by the compressed-tensors library itself (the same config.json and packed tensors a toolchain
writes), so the default tests can gate a checkpoint against its parent in seconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def build_compressed(
    parent: Path,
    out: Path,
    *,
    bits: int = 8,
    group_size: int | None = None,
    activations: bool = False,
    ignore: tuple[str, ...] = ("lm_head",),
) -> Path:
    """Quantize every Linear of the model in `parent` to `bits` (per channel, or per group of `group_size`),
    with int8 dynamic per-token activations when `activations`; save it compressed in `out` (kept when it is
    already there) with the parent's tokenizer files; returns `out`."""
    if (out / "config.json").is_file():
        return out
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(parent, dtype=torch.float32)
    strategy = "group" if group_size else "channel"
    weights = QuantizationArgs(num_bits=bits, type="int", symmetric=True, strategy=strategy, group_size=group_size)
    inputs = (
        QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True)
        if activations
        else None
    )
    scheme = QuantizationScheme(targets=["Linear"], weights=weights, input_activations=inputs)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=list(ignore)))
    with torch.no_grad():
        for module in model.modules():
            if not hasattr(module, "weight_scale"):
                continue
            weight = module.weight
            grouped = weight.reshape(weight.shape[0], -1, group_size) if group_size else weight.unsqueeze(1)
            scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), weights)
            module.weight_scale.copy_(scale.reshape(module.weight_scale.shape))
            module.weight_zero_point.copy_(zero.reshape(module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model)  # the format the library infers for the scheme
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))
    for item in parent.iterdir():
        if item.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")):
            shutil.copy2(item, out / item.name)
    return out
