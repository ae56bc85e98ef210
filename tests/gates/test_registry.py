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


def test_a_plugin_gate_runs_for_the_fields_it_watches_and_gate_diff_names_it(load) -> None:  # noqa: ANN001
    from servegate.contracts.diff import diff_report
    from servegate.gates.registry import gate_watches

    GATES.add("toxicity", _PluginGate, watches=_PluginGate.watches, purpose=_PluginGate.purpose)
    try:
        base = load("base.yaml")
        changed = base.with_changes(postprocess={**base.postprocess.model_dump(mode="python"), "stop": ["\n\n"]})
        planned = {p.name: p for p in plan_gates(base, changed)}
        assert planned["toxicity"].run and planned["toxicity"].changed_paths == ("postprocess.stop",)
        assert diff_report(base, changed, gate_watches())["gates"]["toxicity"] == ["postprocess.stop"]
    finally:
        GATES.remove("toxicity")


def test_a_move_to_another_engine_runs_the_gates_of_what_it_replaces(load) -> None:  # noqa: ANN001
    base = load("base.yaml")
    runtime = {**base.runtime.model_dump(mode="python"), "backend": "endpoint", "endpoint_url": "http://x:8000/v1"}
    planned = {p.name: p for p in plan_gates(base, base.with_changes(runtime=runtime))}
    for name in ("contract", "truncation", "caching", "batching", "load", "quality"):
        assert planned[name].run and "runtime.backend" in planned[name].changed_paths, (name, planned[name])


def test_the_built_in_gates_watch_the_one_trigger_table() -> None:
    from servegate.contracts.diff import GATE_WATCHES
    from servegate.gates.checks.quantization import PRECISION_FIELDS
    from servegate.gates.checks.truncation import TRUNCATION_FIELDS

    assert {name: GATES.entry(name).metadata["watches"] for name in GATE_WATCHES} == GATE_WATCHES
    assert set(PRECISION_FIELDS) <= set(GATE_WATCHES["quantization"])  # what the gate isolates, it watches
    assert set(TRUNCATION_FIELDS) <= set(GATE_WATCHES["truncation"])


def test_gate_check_runs_exactly_the_gates_gate_diff_names(load) -> None:  # noqa: ANN001
    from servegate.contracts.diff import diff_report

    base, tight = load("base.yaml"), load("tight.yaml")
    named = diff_report(base, tight)["gates"]
    planned = {p.name: list(p.changed_paths) for p in plan_gates(base, tight) if p.run}
    assert planned == named and named


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
