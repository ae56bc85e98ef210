"""The gate registry: built-in gates with metadata, duplicates, suggestions, third-party entry points."""

from __future__ import annotations

import importlib.metadata

import pytest

from servegate.gates.base import Gate
from servegate.gates.check import GATES, plan_gates
from servegate.gates.registry import Registry, RegistryError, register_gate

BUILT_IN = {"contract", "quantization", "truncation", "caching", "batching", "fallback", "quality"}


def test_built_in_gates_carry_their_metadata() -> None:
    assert BUILT_IN <= set(GATES.names())
    for entry in GATES:
        if entry.name in BUILT_IN:
            assert entry.metadata["watches"], entry.name
            assert entry.metadata["purpose"].endswith("."), entry.name
            assert entry.obj.name == entry.name


def test_a_duplicate_name_fails() -> None:
    with pytest.raises(RegistryError, match="'quantization' is already registered"):

        @register_gate("quantization", watches=("runtime",), purpose="Again.")
        class Again(Gate):
            pass


def test_an_unknown_name_suggests_the_closest_and_lists_all() -> None:
    with pytest.raises(RegistryError) as info:
        GATES.get("quantisation")
    message = str(info.value)
    assert "did you mean 'quantization'?" in message
    assert "Available: " in message and "batching" in message and "truncation" in message


def test_forcing_an_unknown_gate_is_a_usage_error(load) -> None:  # noqa: ANN001
    served = load("base.yaml")
    with pytest.raises(RegistryError, match="did you mean 'caching'"):
        plan_gates(served.reference_form(), served, forced=["cachin"])


class _PluginGate(Gate):
    watches = ("postprocess.stop",)
    purpose = "A third-party check."


def test_third_party_gates_register_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    point = importlib.metadata.EntryPoint("toxicity", f"{__name__}:_PluginGate", "servegate.gates")

    def entry_points(group: str):  # noqa: ANN202
        return [point] if group == "servegate.gates" else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    registry: Registry[type[Gate]] = Registry("gate", group="servegate.gates")
    assert registry.names() == ["toxicity"]
    assert registry.entry("toxicity").metadata == {"watches": ("postprocess.stop",), "purpose": "A third-party check."}


def test_a_broken_plugin_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    point = importlib.metadata.EntryPoint("broken", "servegate_no_such_module:Gate", "servegate.gates")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [point])
    registry: Registry[type[Gate]] = Registry("gate", group="servegate.gates")
    with pytest.raises(RegistryError, match="plugin 'broken'"):
        registry.names()


def test_plan_says_why_each_gate_runs_or_is_skipped(load) -> None:  # noqa: ANN001
    base, tight = load("base.yaml"), load("tight.yaml")
    planned = {p.name: p for p in plan_gates(base, tight)}
    assert planned["truncation"].run and "preprocess.max_input_tokens" in planned["truncation"].why
    assert planned["contract"].run
    assert not planned["quantization"].run and planned["quantization"].why.startswith("no watched field changed")
    assert not planned["caching"].run


def test_reference_mode_runs_the_gates_of_every_optimization(load) -> None:  # noqa: ANN001
    served = load("base.yaml")
    planned = {p.name: p for p in plan_gates(served.reference_form(), served, mode="reference")}
    for name in ("quantization", "truncation", "caching", "batching", "fallback", "contract"):
        assert planned[name].run, (name, planned[name].why)
    assert not planned["quality"].run
