"""Linear layers on CPU through oneDNN with weights packed once at load (`runtime.cpu_linear: onednn`).

A plain `F.linear` hands its weight to the BLAS in row-major order, and for the few rows of a decode step the
BLAS repacks that weight into its kernel's blocked layout on every call: at batch 8-64 the repacking reads and
writes the whole matrix again, as much memory traffic as the product itself. vLLM's CPU build avoids it by
reordering each weight once into oneDNN's blocked layout; torch ships the same oneDNN (`torch.ops.mkldnn`), and
one packed weight serves every batch size (oneDNN picks its kernel per call, the layout stays).

`route_linear_onednn(layer)` packs one `nn.Linear` whose weight is a plain float32 or bfloat16 CPU tensor and
releases the dense copy, so the model holds its linear weights once, as vLLM's does; fused_linear.py routes a whole
model (`route_linears_onednn`), sibling projections packed together. A weight shared with
another module (an LM head tied to the embeddings) keeps its dense copy and is not routed: the embedding reads
it. Quantized weights are tensor subclasses with their own kernels and stay as they are.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

ONEDNN_DTYPES = (torch.float32, torch.bfloat16)
"""Weight dtypes oneDNN's inner product takes here (bfloat16 runs AVX-512 bf16 or AMX where the CPU has them)."""


def onednn_available() -> bool:
    """Whether this torch build has oneDNN (mkldnn) for CPU tensors."""
    return bool(torch.backends.mkldnn.is_available())


def require_onednn() -> None:
    """Refuse `runtime.cpu_linear: onednn` on a torch build without oneDNN, naming the fix."""
    if not onednn_available():
        raise ValueError("runtime.cpu_linear is onednn but this torch build has no oneDNN (mkldnn): set torch")


def is_dense_cpu(weight: Any, dtypes: tuple[torch.dtype, ...]) -> bool:
    """A plain CPU tensor of one of `dtypes` (not a quantized tensor subclass, not a meta tensor)."""
    data = weight.data if isinstance(weight, torch.nn.Parameter) else weight
    return type(data) is torch.Tensor and data.dtype in dtypes and data.device.type == "cpu"


def weight_bytes(linears: list[torch.nn.Linear]) -> int:
    """Bytes of the weights of `linears` (as declared: a released weight still counts its full size)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in linears)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` ([out, in]) reordered into oneDNN's blocked layout, chosen for no particular batch size."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def placeholder(like: torch.Tensor) -> torch.Tensor:
    """A tensor of `like`'s shape, dtype and device over one element (stride 0): what stays of a released
    weight, so code that reads the parameter's shape, dtype or size still sees the layer's."""
    return torch.zeros((), dtype=like.dtype, device=like.device).expand(like.shape)


def _onednn_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """y = x W^T + b through the packed weight; a dense product (unpacked once more) for anything else."""
    state: dict[str, Any] = self._servegate_onednn  # type: ignore[assignment]  # set by route_linears_onednn
    weight = self.weight
    if weight.data_ptr() != state["placeholder_ptr"]:
        _repack(self, state)
    packed = state["packed"]
    if x.dtype != packed.dtype or x.device.type != "cpu" or (torch.is_grad_enabled() and x.requires_grad):
        # autograd or a mixed dtype: a rare path, outside serving; the dense weight comes back for it
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, packed.to_dense().to(x.dtype), bias)
    return packed_product(x, packed, self.bias)


def packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b through a packed weight, for `x` of any leading shape in the packed weight's dtype."""
    rows = x.reshape(-1, x.shape[-1])
    if not rows.is_contiguous():
        rows = rows.contiguous()
    out = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])


def _repack(module: torch.nn.Linear, state: dict[str, Any]) -> None:
    """Pack a weight that replaced the released one (`layer.weight = ...`), and release it in turn."""
    check_replacement(module)
    state["packed"] = pack_weight(module.weight)
    _release(module, state)


def check_replacement(module: torch.nn.Linear) -> None:
    """Refuse a routed linear's new weight that cannot be packed, or that is a converted placeholder.

    A conversion of the placeholder (`model.to(...)` after routing) would come back as a dense tensor of zeros,
    and packing that would serve zeros: that is refused, loudly.
    """
    weight = module.weight
    if not is_dense_cpu(weight, ONEDNN_DTYPES):
        raise ValueError(
            f"a oneDNN-routed linear's weight became {type(weight.data).__name__} {weight.dtype} on "
            f"{weight.device}: convert or quantize the model before runtime.cpu_linear: onednn packs it"
        )
    if weight.numel() > 1 and (0 in weight.stride() or not bool(weight.detach().any())):
        raise ValueError(
            "a oneDNN-routed linear's weight is a placeholder or all zeros: the model was converted (.to) after "
            "its weights were packed and released; convert it before runtime.cpu_linear: onednn packs it"
        )


def _release(module: torch.nn.Linear, state: dict[str, Any]) -> None:
    """Swap the dense weight for a one-element placeholder of its shape, remembering where it lives."""
    module.weight.data = placeholder(module.weight)
    state["placeholder_ptr"] = module.weight.data_ptr()


def _shared_weights(model: torch.nn.Module) -> set[int]:
    """ids of the parameters more than one module holds (tied LM head and embeddings)."""
    seen: dict[int, int] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            seen[id(parameter)] = seen.get(id(parameter), 0) + 1
    return {key for key, count in seen.items() if count > 1}


def packable_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's `nn.Linear`s that `route_linears_onednn` would pack: plain float32/bfloat16 CPU weights
    that no other module holds."""
    shared = _shared_weights(model)
    return [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and is_dense_cpu(m.weight, ONEDNN_DTYPES) and id(m.weight) not in shared
    ]


def route_linear_onednn(module: torch.nn.Linear) -> None:
    """Pack one linear's weight for oneDNN, release the dense copy, and send its calls through the packed one."""
    state: dict[str, Any] = {"packed": pack_weight(module.weight)}
    _release(module, state)
    module._servegate_onednn = state  # type: ignore[assignment]  # a plain attribute on this instance
    module.forward = types.MethodType(_onednn_forward, module)  # type: ignore[method-assign]  # this instance only
