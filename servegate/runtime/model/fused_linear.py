"""A whole model's linears through oneDNN, sibling projections run as one product (`runtime.cpu_linear: onednn`).

transformers' attention layers call `q_proj`, `k_proj` and `v_proj` one after another on the same hidden states,
and their MLPs `gate_proj` and `up_proj` on the same input. Routed one by one (onednn_linear.py), each is a
oneDNN call of its own over the same rows: five calls a layer where two would do, and each call too narrow for
two threads to share well at decode. Here the siblings' weights are packed side by side into one weight once, at
load. The first sibling called computes the whole product, and each sibling returns its own columns of it (a
view, no copy); the model's own code is unchanged. The product is dropped once every sibling has taken its
columns, so nothing is held between calls (each thread holds its own).

oneDNN reduces each output column over the same input dimension however many columns a weight has, so every
sibling gets bitwise the rows its own product gave (checked for float32 and bfloat16 at 1-512 rows on the 134M
Llama's and SmolLM2's shapes, and by tests/runtime/test_fused_linear.py on each run). Measured per layer at 64 rows
(benchmarks/README.md, "Sibling projections as one product"), the fused q/k/v and gate/up products took less time
than the separate ones.
"""

from __future__ import annotations

import threading
import types
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from servegate.runtime.model.onednn_linear import (
    check_replacement,
    pack_weight,
    packable_linears,
    packed_product,
    placeholder,
    require_onednn,
    route_linear_onednn,
)

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Attribute names of projections a module calls on the same input, in the order its forward calls them."""


class _Held(threading.local):
    """A thread's last product of a group, until every sibling has taken its columns (per thread, so that two
    threads running one model never take each other's columns)."""

    def __init__(self) -> None:
        self.source: torch.Tensor | None = None
        """The input `result` was computed from."""
        self.result: torch.Tensor | None = None
        self.waiting: set[int] = set()
        """Members that have not taken their columns of `result` yet."""


@dataclass(eq=False)
class FusedProjection:
    """Sibling linears packed into one weight, and each thread's last product until every sibling has taken its
    columns."""

    members: list[torch.nn.Linear]
    packed: torch.Tensor
    """The siblings' weights stacked ([sum of out, in]) in oneDNN's blocked layout."""
    bias: torch.Tensor | None
    columns: list[tuple[int, int]]
    """Each member's [start, end) in the fused output."""
    placeholder_ptrs: list[int]
    """Where each member's released weight lies: another pointer means the weight was replaced since."""
    held: _Held = field(default_factory=_Held)
    """This thread's last product, held only until every member has taken its columns."""

    def columns_of(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Member `index`'s product of `x`: its columns of the fused product, computed once per input."""
        held = self.held
        result = held.result
        if result is None or x is not held.source or index not in held.waiting:
            result = held.result = packed_product(x, self.packed, self.bias)
            held.source, held.waiting = x, set(range(len(self.members)))
        held.waiting.discard(index)
        if not held.waiting:
            held.source = held.result = None
        start, end = self.columns[index]
        return result[..., start:end]

    def dense(self, index: int) -> torch.Tensor:
        """Member `index`'s weight unpacked ([out, in])."""
        start, end = self.columns[index]
        return self.packed.to_dense()[start:end]

    def replaced(self) -> bool:
        """Whether any member's weight was replaced since packing (`layer.weight = ...`)."""
        return any(m.weight.data_ptr() != ptr for m, ptr in zip(self.members, self.placeholder_ptrs, strict=True))

    def dissolve(self) -> None:
        """Route every member on its own again: a replaced weight is packed as it is now, the others from their
        rows of the fused weight."""
        for index, member in enumerate(self.members):
            if member.weight.data_ptr() == self.placeholder_ptrs[index]:
                member.weight.data = self.dense(index).clone()
            else:
                check_replacement(member)
            del member._servegate_fused
            route_linear_onednn(member)


def _fused_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A fused member's forward: its columns of the siblings' one product; F.linear off the packed path."""
    group, index = self._servegate_fused  # type: ignore[misc]  # set by fuse_siblings
    if group.replaced():
        group.dissolve()
        return self.forward(x)
    if x.dtype != group.packed.dtype or x.device.type != "cpu" or (torch.is_grad_enabled() and x.requires_grad):
        # autograd or a mixed dtype: a rare path, outside serving; the dense weight comes back for it
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, group.dense(index).to(x.dtype), bias)
    return group.columns_of(index, x)


def _siblings(module: torch.nn.Module, names: tuple[str, ...], packable: set[int]) -> list[torch.nn.Linear] | None:
    """`module`'s linears under `names` when all are packable, of one input width and dtype, and all with a bias
    or all without; else None."""
    members = [getattr(module, name, None) for name in names]
    if not all(isinstance(m, torch.nn.Linear) and id(m) in packable for m in members):
        return None
    linears: list[torch.nn.Linear] = members  # type: ignore[assignment]  # checked just above
    first = linears[0]
    if any(m.in_features != first.in_features or m.weight.dtype != first.weight.dtype for m in linears):
        return None
    if len({m.bias is None for m in linears}) != 1:
        return None
    return linears


def fuse(members: list[torch.nn.Linear]) -> FusedProjection:
    """Pack `members`' weights side by side, release their dense copies, and route their calls to the fused one."""
    packed = pack_weight(torch.cat([m.weight.detach() for m in members]))
    biases = [m.bias for m in members]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases if b is not None])
    columns: list[tuple[int, int]] = []
    for member in members:
        start = columns[-1][1] if columns else 0
        columns.append((start, start + member.out_features))
        member.weight.data = placeholder(member.weight)
    group = FusedProjection(members, packed, bias, columns, [m.weight.data_ptr() for m in members])
    for index, member in enumerate(members):
        member._servegate_fused = (group, index)  # type: ignore[assignment]  # a plain attribute on this instance
        member.forward = types.MethodType(_fused_forward, member)  # type: ignore[method-assign]  # this instance only
    return group


def fuse_siblings(model: torch.nn.Module, linears: list[torch.nn.Linear]) -> set[int]:
    """Fuse every group of sibling projections (SIBLINGS) among `linears`; the ids of the linears fused."""
    packable = {id(m) for m in linears}
    fused: set[int] = set()
    for module in model.modules():
        for names in SIBLINGS:
            members = _siblings(module, names, packable - fused)
            if members is not None:
                fuse(members)
                fused.update(id(m) for m in members)
    return fused


def route_linears_onednn(model: torch.nn.Module, *, fuse_projections: bool = True) -> int:
    """Pack every packable linear of `model` for oneDNN and release its dense weight; returns how many were.
    Sibling projections are packed together and run as one product, the other linears one by one
    (`fuse_projections=False`: every linear on its own, for benchmarks/fused_projections.py's comparison)."""
    require_onednn()
    linears = packable_linears(model)
    fused = fuse_siblings(model, linears) if fuse_projections else set()
    for module in linears:
        if id(module) not in fused:
            route_linear_onednn(module)
    return len(linears)


def fused_groups(model: torch.nn.Module) -> list[FusedProjection]:
    """The distinct FusedProjection groups of `model`'s routed linears (for tests and diagnostics)."""
    seen: dict[int, FusedProjection] = {}
    for module in model.modules():
        state = getattr(module, "_servegate_fused", None)
        if state is not None:
            seen[id(state[0])] = state[0]
    return list(seen.values())
