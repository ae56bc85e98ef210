"""Weight quantization of a loaded model, in place: torchao where it runs here, simulated where not.

| method       | torchao config                                   | simulated form (round trip)           |
|--------------|--------------------------------------------------|---------------------------------------|
| int8-weight  | Int8WeightOnlyConfig                             | int8 per output channel               |
| int8-dynamic | Int8DynamicActivationInt8WeightConfig            | int8 weights + int8 per-token inputs  |
| int4-weight  | CUDA bf16: Int4WeightOnlyConfig (tinygemm tiles) | int4 per group                        |
|              | else IntxWeightOnlyConfig(int4, PerGroup(gs))    |                                       |
| fp8-weight   | Float8WeightOnlyConfig                           | float8_e4m3fn per output channel      |
| int3-weight  | (none)                                           | int3 per group                        |
| int2-weight  | (none)                                           | int2 per group                        |

Whether a torchao config runs is found out by a probe on one small layer on the model's device and
dtype (e.g. int4 tile packing needs a package CPU builds lack; float8 dynamic needs CUDA sm89+). On CUDA
int4 first tries torchao's tinygemm layout, whose products are torch's `_weight_int4pack_mm` kernel on
packed int4 (bfloat16 activations, sm80+); where that probe fails it falls back to the generic int4 form.
Simulated means the weights are rounded through the format and stored back in the compute dtype:
the accuracy effect is real, the memory saving is not, and the report says `simulated: true`.
`lm_head` and the input embeddings stay unquantized unless the manifest includes them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from servegate.contracts.sections import Quantization, QuantMethod
from servegate.runtime.model.checkpoint_scheme import CheckpointScheme

INT_BITS = {"int8-weight": 8, "int8-dynamic": 8, "int4-weight": 4, "int3-weight": 3, "int2-weight": 2}
"""Bits per weight of the integer methods."""
GROUPED = ("int4-weight", "int3-weight", "int2-weight")
"""Methods with one scale per group of `group_size` weights (the others: one per output channel)."""
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


@dataclass(frozen=True)
class QuantizationReport:
    """What quantize_model did, for reports and gates."""

    method: str
    backend: str
    """`torchao` when torchao quantized the linear layers, `simulated` when they were round-tripped."""
    simulated: bool
    """True when any module was only simulated (its memory saving is not real)."""
    modules_quantized: int
    weight_bytes_before: int
    """Bytes of the quantized modules' weights before."""
    weight_bytes_after: int
    """Bytes they occupy after (torchao: as stored; simulated: what the format would take)."""
    simulated_modules: int = 0
    group_size: int | None = None
    torchao_config: str | None = None
    """The torchao config that quantized the linear layers (e.g. `Int4WeightOnlyConfig`), None when none did."""

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON reports."""
        return dict(self.__dict__)


def quantize_model(model: nn.Module, q: Quantization) -> QuantizationReport:
    """Quantize `model` in place as `q` declares and report how."""
    if q.method == "none":
        return QuantizationReport("none", "none", False, 0, 0, 0)
    linears = _selected_linears(model, q)
    embeddings = _selected_embeddings(model, q)
    _untie_partially_selected(model, linears, embeddings)
    before = sum(_nbytes(m.weight) for m in list(linears.values()) + list(embeddings.values()))
    example = next(iter(linears.values()), None)
    config_name = (
        _working_torchao_config(q.method, q.group_size, example.weight.device, example.weight.dtype)
        if example is not None
        else None
    )
    config = _torchao_config(q, config_name) if config_name is not None else None
    use_torchao = config is not None
    after = 0
    simulated = 0
    torchao_names = (
        {n for n, m in linears.items() if q.method not in GROUPED or m.in_features % q.group_size == 0}
        if use_torchao
        else set()
    )
    if torchao_names:
        from torchao.quantization import quantize_

        quantize_(model, config, filter_fn=lambda module, fqn: fqn in torchao_names)
        after += sum(_nbytes(linears[n].weight) for n in torchao_names)
    for name, module in linears.items():
        if name not in torchao_names:
            after += _simulate(module, q)
            simulated += 1
    for embedding in embeddings.values():
        after += _simulate(embedding, q)
        simulated += 1
    return QuantizationReport(
        method=q.method,
        backend="torchao" if torchao_names else "simulated",
        simulated=simulated > 0,
        modules_quantized=len(linears) + len(embeddings),
        weight_bytes_before=before,
        weight_bytes_after=after,
        simulated_modules=simulated,
        group_size=q.group_size if q.method in GROUPED else None,
        torchao_config=config_name if torchao_names else None,
    )


# --- which modules --------------------------------------------------------------------------------


def _selected_linears(model: nn.Module, q: Quantization) -> dict[str, nn.Linear]:
    """name -> nn.Linear to quantize (lm_head only with include_lm_head)."""
    # nn.Module types every attribute it does not declare as Tensor | Module: hasattr found a method here
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[operator]
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and (q.include_lm_head or module is not head)
    }


def _selected_embeddings(model: nn.Module, q: Quantization) -> dict[str, nn.Embedding]:
    if not q.include_embeddings:
        return {}
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Embedding)}


def _untie_partially_selected(model: nn.Module, linears: dict[str, nn.Linear], embeddings: dict[str, Any]) -> None:
    """Give lm_head its own weight when it is tied to the embeddings but only one of them is quantized."""
    # nn.Module types every attribute it does not declare as Tensor | Module: hasattr found a method here
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[operator]
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None  # type: ignore[operator]
    if head is None or emb is None or head.weight is not emb.weight:
        return
    if (head in linears.values()) != (emb in embeddings.values()):
        head.weight = nn.Parameter(emb.weight.detach().clone(), requires_grad=False)


def _nbytes(tensor: torch.Tensor) -> int:
    """Bytes a (possibly torchao-subclassed) tensor really holds."""
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is not None and type(tensor) not in (torch.Tensor, nn.Parameter):
        names, _ = flatten(tensor)
        return sum(_nbytes(getattr(tensor, n)) for n in names if isinstance(getattr(tensor, n), torch.Tensor))
    return tensor.numel() * tensor.element_size()


# --- torchao ---------------------------------------------------------------------------------------


TORCHAO_CONFIGS = {
    "int8-weight": ("Int8WeightOnlyConfig",),
    "int8-dynamic": ("Int8DynamicActivationInt8WeightConfig",),
    "int4-weight": ("Int4WeightOnlyConfig", "IntxWeightOnlyConfig"),
    "fp8-weight": ("Float8WeightOnlyConfig",),
}
"""torchao configs per method, in the order they are tried (the first whose probe runs is used)."""
CUDA_ONLY_CONFIGS = frozenset({"Int4WeightOnlyConfig"})
"""Configs whose kernels exist only on CUDA (tinygemm's int4 layout): never tried on another device."""


def _torchao_config(q: Quantization, name: str) -> Any:
    """The torchao config `name` for `q.method`, or None when this torchao lacks it."""
    try:
        import torchao.quantization as tq
        from torchao.quantization.granularity import PerGroup
    except ImportError:
        return None
    factory = getattr(tq, name, None)
    if factory is None:
        return None
    if name == "Int4WeightOnlyConfig":
        return factory(group_size=q.group_size, int4_packing_format="tile_packed_to_4d")
    if name == "IntxWeightOnlyConfig":
        # torch.int4 exists at run time, but torch's stubs do not declare it
        return factory(weight_dtype=torch.int4, granularity=PerGroup(q.group_size))  # type: ignore[attr-defined]
    return factory()


def _working_torchao_config(
    method: QuantMethod, group_size: int, device: torch.device, dtype: torch.dtype
) -> str | None:
    """The first of the method's torchao configs that quantizes and runs a small layer here, else None."""
    for name in TORCHAO_CONFIGS.get(method, ()):
        if name in CUDA_ONLY_CONFIGS and device.type != "cuda":
            continue
        if _torchao_runs(method, group_size, device, dtype, name):
            return name
    return None


@functools.cache
def _torchao_runs(method: QuantMethod, group_size: int, device: torch.device, dtype: torch.dtype, name: str) -> bool:
    """Whether torchao's config `name` for `method` quantizes and runs a small linear layer here."""
    from servegate.contracts.sections import Quantization as Q

    config = _torchao_config(Q(method=method, group_size=group_size), name)
    if config is None:
        return False
    try:
        from torchao.quantization import quantize_

        probe = nn.Sequential(nn.Linear(group_size * 2, 16, bias=True)).to(device=device, dtype=dtype)
        quantize_(probe, config)
        if type(probe[0].weight.data) is torch.Tensor:  # torchao left the layer as it was (shape or dtype)
            return False
        with torch.inference_mode():
            out = probe(torch.randn(3, group_size * 2, device=device, dtype=dtype))
        return bool(torch.isfinite(out).all())
    except Exception:  # ImportError of an optional kernel package, unsupported device or dtype
        return False


# --- simulation ------------------------------------------------------------------------------------


def round_trip(weight: torch.Tensor, method: str, group_size: int) -> torch.Tensor:
    """`weight` [out, in] rounded through the method's format (symmetric scales), in its own dtype."""
    w = weight.detach().float()
    rows, cols = w.shape
    group = group_size if method in GROUPED else cols
    pad = (-cols) % group
    grouped = torch.nn.functional.pad(w, (0, pad)).view(rows, -1, group)  # [out, groups, group]
    amax = grouped.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    if method == "fp8-weight":
        scale = amax / FP8_MAX
        rounded = (grouped / scale).to(torch.float8_e4m3fn).float() * scale
    else:
        qmax = 2 ** (INT_BITS[method] - 1) - 1
        scale = amax / qmax
        rounded = torch.clamp(torch.round(grouped / scale), -qmax - 1, qmax) * scale
    return rounded.view(rows, -1)[:, :cols].to(weight.dtype)


def _int8_inputs(module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Forward pre-hook: inputs rounded to int8 per token (dynamic activation quantization)."""
    x = args[0]
    scale = x.detach().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127
    return (torch.clamp(torch.round(x / scale), -128, 127) * scale, *args[1:])


def _simulate(module: nn.Linear | nn.Embedding, q: Quantization) -> int:
    """Round-trip the module's weight in place; returns the bytes the real format would take."""
    weight = module.weight
    with torch.no_grad():
        weight.copy_(round_trip(weight, q.method, q.group_size))
    if q.method == "int8-dynamic" and isinstance(module, nn.Linear):
        module.register_forward_pre_hook(_int8_inputs)
    rows, cols = weight.shape
    bits = 8 if q.method == "fp8-weight" else INT_BITS[q.method]
    groups = rows * (-(-cols // q.group_size) if q.method in GROUPED else 1)
    return (weight.numel() * bits + 7) // 8 + groups * weight.element_size()


def _fp8_inputs(module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Forward pre-hook: inputs rounded through float8_e4m3fn per token (dynamic fp8 activations)."""
    x = args[0]
    scale = x.detach().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return ((x / scale).to(torch.float8_e4m3fn).to(x.dtype) * scale, *args[1:])


def simulate_activations(model: nn.Module, scheme: CheckpointScheme) -> int:
    """For a compressed-tensors checkpoint dequantized at load whose scheme quantizes activations (W8A8),
    round each quantized layer's inputs per token as its kernels would; returns the layers hooked.

    The layers are the ones the checkpoint's own config groups target, less its `ignore` list, matched by
    compressed-tensors itself (class names, module names and `re:` patterns).
    """
    if scheme.activations is None:
        return 0
    from compressed_tensors.utils.match import match_named_modules

    hook = _int8_inputs if scheme.activations.startswith("int8") else _fp8_inputs
    hooked = 0
    for _, module in match_named_modules(model, scheme.targets, scheme.ignored):
        if isinstance(module, nn.Linear):
            module.register_forward_pre_hook(hook)
            hooked += 1
    return hooked
