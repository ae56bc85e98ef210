"""Compiled steps gather rotary cos/sin from a table built by the model's own rotary module (rotary_table.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from test_model_runner import tiny_causal_lm

from servegate.runtime.model.rotary_table import RotaryTable, table_bytes_per_position, table_rotary


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_table_gives_what_the_module_computes_at_every_position(dtype: torch.dtype) -> None:
    model = tiny_causal_lm("llama").to(dtype)
    rotary = model.model.rotary_emb
    table = RotaryTable(rotary, 64, dtype, torch.device("cpu"))
    positions = torch.tensor([[0, 5, 6, 7, 63], [1, 2, 3, 40, 41]])
    x = torch.zeros(2, 5, 8, dtype=dtype)
    expected_cos, expected_sin = rotary(x, positions)
    cos, sin = table(x, positions)
    assert cos.dtype == dtype and cos.shape == expected_cos.shape
    assert torch.equal(cos, expected_cos) and torch.equal(sin, expected_sin)


def test_only_static_rotary_types_are_tabled_and_the_source_model_keeps_its_module() -> None:
    model = tiny_causal_lm("llama").float()
    view = copy.deepcopy(model)
    assert table_rotary(view, 32, torch.float32, torch.device("cpu")) == 1
    assert isinstance(view.model.rotary_emb, RotaryTable) and view.model.rotary_emb.cos.shape[0] == 32
    assert not isinstance(model.model.rotary_emb, RotaryTable)
    # a rotary type that rescales with the length it sees stays computed
    view = copy.deepcopy(model)
    view.model.rotary_emb.rope_type = "dynamic"
    assert table_rotary(view, 32, torch.float32, torch.device("cpu")) == 0
    assert not isinstance(view.model.rotary_emb, RotaryTable)


@pytest.mark.parametrize(
    ("fields", "per_position"),
    [
        ({}, 2 * 16 * 2),  # transformers' defaults: a default rotary of head_dim 64 / 4 = 16
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 2 * 16 * 2),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 0),  # recomputed per length: not tabled
        ({"head_dim": 32}, 2 * 32 * 2),
    ],
)
def test_the_bytes_a_table_holds_per_position_follow_the_config(fields: dict, per_position: int) -> None:
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, **fields}
    assert table_bytes_per_position(config, 2) == per_position


def test_a_model_with_learned_positions_has_no_table() -> None:
    assert table_bytes_per_position({"model_type": "gpt2", "n_embd": 64, "n_head": 4}, 4) == 0
    assert table_bytes_per_position({"model_type": "no-such-model"}, 4) == 0
