"""The quantization variants the datasheet measures, named as the manifest names them.

Only the decoder's ``nn.Linear`` layers are quantized; ``lm_head`` and the embeddings stay in
fp32. ``int2-weight`` has no torchao kernel: its weights are round-tripped through 2-bit groups
and stored in fp32 again (``simulated``), which gives int2's accuracy but not its speed or size.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from transformers import PreTrainedModel

VARIANTS: tuple[str, ...] = ("none", "int8-weight", "int4-weight", "fp8-weight", "int2-weight")
SIMULATED: frozenset[str] = frozenset({"int2-weight"})
GROUP_SIZE = 32


def _decoder_linear(module: nn.Module, fqn: str) -> bool:
    return isinstance(module, nn.Linear) and fqn != "lm_head"


def _torchao(config_factory: Callable[[], object]) -> Callable[[nn.Module], None]:
    def apply(model: nn.Module) -> None:
        from torchao.quantization import quantize_

        quantize_(model, config_factory(), filter_fn=_decoder_linear)

    return apply


def _int8() -> object:
    from torchao.quantization import Int8WeightOnlyConfig

    return Int8WeightOnlyConfig()


def _int4() -> object:
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    # torch.int4 exists at run time, but torch's stubs do not declare it
    return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(GROUP_SIZE))  # type: ignore[attr-defined]


def _fp8() -> object:
    from torchao.quantization import Float8WeightOnlyConfig

    return Float8WeightOnlyConfig()


def round_trip_groups(weight: torch.Tensor, bits: int, group_size: int = GROUP_SIZE) -> torch.Tensor:
    """Asymmetric min-max quantization of each row group of ``weight`` to ``bits``, dequantized back."""
    out_features, in_features = weight.shape
    if in_features % group_size:
        raise ValueError(f"in_features {in_features} is not a multiple of group size {group_size}")
    groups = weight.reshape(out_features, in_features // group_size, group_size)  # [O, G, group]
    low = groups.amin(dim=-1, keepdim=True)
    high = groups.amax(dim=-1, keepdim=True)
    levels = 2**bits - 1
    scale = ((high - low) / levels).clamp_min(1e-8)
    codes = ((groups - low) / scale).round().clamp(0, levels)
    return (codes * scale + low).reshape(out_features, in_features)


def _int2_simulated(model: nn.Module) -> None:
    with torch.no_grad():
        for fqn, module in model.named_modules():
            if _decoder_linear(module, fqn):
                assert isinstance(module, nn.Linear)
                module.weight.copy_(round_trip_groups(module.weight, bits=2))


_APPLY: dict[str, Callable[[nn.Module], None]] = {
    "int8-weight": _torchao(_int8),
    "int4-weight": _torchao(_int4),
    "fp8-weight": _torchao(_fp8),
    "int2-weight": _int2_simulated,
}


def quantized_copy(model: PreTrainedModel, variant: str) -> PreTrainedModel:
    """A copy of ``model`` with its decoder Linear weights in ``variant``; ``none`` copies as is."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown quantization variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    copied = copy.deepcopy(model)
    if variant != "none":
        _APPLY[variant](copied)
    return copied.eval()
