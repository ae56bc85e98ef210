"""Rotary position embeddings read from a table in compiled graphs (`runtime.compile: steps`).

A Hugging Face decoder computes its rotary cos/sin once per forward, from the positions, and hands the pair to every
layer. Compiled, inductor fuses that cheap pointwise work into each layer's q/k kernel instead, so cos and sin are
evaluated once per layer, per head and per element: on the 134M benchmark Llama, the fused rotary kernel took about
1 ms of every layer of a 512-token prefill step (a 2-core Intel Xeon, bfloat16). A table of every position's cos and
sin, computed once by the model's own rotary module, turns that into a gather.

Only rotary types whose frequencies do not depend on the sequence length are tabled ("dynamic" and "longrope" rescale
with the length the forward sees); any other module stays as it is. The table holds one cos/sin row pair per slot of
the KV pool, so it grows with the pool: `gate plan` counts it (table_bytes_per_position).
"""

from __future__ import annotations

from typing import Any

import torch

from servegate.runtime.model.kv_memory import kv_dims_from_config

STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3"})
"""Rotary types whose cos/sin at a position is the same whatever else the step holds."""


def table_bytes_per_position(config: dict[str, Any], bytes_per_element: int) -> int:
    """Bytes a RotaryTable holds per position for a model of this config.json (its cos and sin rows), or 0 when the
    model's rotary is not a static one that table_rotary replaces, or it has none (learned positions). Read through
    transformers' config class, whose defaults give a rotary to configs that declare none of its fields."""
    from transformers import AutoConfig

    try:
        known: Any = AutoConfig.for_model(**config)
    except (KeyError, ValueError, TypeError):  # a model type this transformers does not know: the file as it is
        known = None
    field = (lambda name: getattr(known, name, None)) if known is not None else config.get
    params = field("rope_parameters") or field("rope_scaling")
    if not isinstance(params, dict) or set(params) & {"full_attention", "sliding_attention"}:
        return 0  # no rotary, or one per attention type (more than one table)
    if (params.get("rope_type") or params.get("type") or "default") not in STATIC_ROPE_TYPES:
        return 0
    head_dim = int(field("qk_rope_head_dim") or kv_dims_from_config(known if known is not None else config).head_dim)
    return 2 * int(head_dim * float(field("partial_rotary_factor") or 1.0)) * bytes_per_element


class RotaryTable(torch.nn.Module):
    """cos/sin of positions 0..positions-1 in the model's dtype, computed once by `rotary` and gathered per step."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, rotary: torch.nn.Module, positions: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        probe = torch.empty(0, dtype=dtype, device=device)  # the module reads only its dtype and device
        with torch.no_grad():
            cos, sin = rotary(probe, torch.arange(positions, device=device)[None])
        self.register_buffer("cos", cos[0].contiguous(), persistent=False)
        self.register_buffer("sin", sin[0].contiguous(), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [batch, tokens, head_dim] of `position_ids` [batch, tokens], as the module it replaces."""
        return self.cos[position_ids], self.sin[position_ids]


def table_rotary(model: torch.nn.Module, positions: int, dtype: torch.dtype, device: torch.device) -> int:
    """Replace each static rotary module of `model` (a module named `rotary_emb` with a `rope_type` in
    STATIC_ROPE_TYPES) by a RotaryTable of `positions` positions; the number replaced."""
    replaced = 0
    for parent in list(model.modules()):
        rotary: Any = getattr(parent, "rotary_emb", None)
        if isinstance(rotary, torch.nn.Module) and getattr(rotary, "rope_type", None) in STATIC_ROPE_TYPES:
            parent.rotary_emb = RotaryTable(rotary, positions, dtype, device)
            replaced += 1
    return replaced
