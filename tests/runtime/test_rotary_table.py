"""Compiled steps gather rotary cos/sin from a table built by the model's own rotary module (rotary_table.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from test_model_runner import tiny_causal_lm

from servegate.runtime.model.rotary_table import RotaryTable, table_rotary


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
