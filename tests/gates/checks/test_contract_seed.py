"""The seed is measured on servegate's own runtime too: where draws differ, and past the response cache."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servegate.contracts.manifest import ServedModel
from servegate.gates.check import run_check
from servegate.gates.checks import contract
from servegate.gates.probes.contract_measure import SEED_PROMPTS, SEED_TEMPERATURE, SEEDS
from servegate.gates.suites.output_cache import OutputCache

CACHED: dict[str, Any] = {
    "name": "cached",
    "weights": {"source": "zoo:tiny-primary"},
    "preprocess": {"chat_template": "none", "max_input_tokens": 64, "tenant_from": "header"},
    "runtime": {"max_model_len": 128},
    "postprocess": {"max_output_tokens": 32, "response_cache": {"enabled": True, "scope": "global"}},
    "quality": {"suites": [{"name": "arith", "dataset": "zoo:arith", "limit": 8, "public": True}]},
}


def contract_of(served: ServedModel) -> Any:
    base = ServedModel.model_validate(json.loads(json.dumps(CACHED)))
    report = run_check(base, served, mode="change", forced=["contract"], cache=OutputCache(enabled=False))
    return next(g for g in report.gates if g.name == "contract")


def test_the_zoo_models_draws_differ_at_the_probe_temperature_and_repeat_with_their_seed() -> None:
    """The figures the probe rests on: on each probe prompt the two seeds give different text, a seed the same."""
    from servegate.runtime import build
    from servegate.runtime.types import GenerationRequest, SamplingParams

    engine = build(ServedModel.model_validate(CACHED), fallback=False)
    for prompt in SEED_PROMPTS:
        draws = [
            engine.generate([GenerationRequest(f"d{i}", prompt, params=SamplingParams(16, SEED_TEMPERATURE, seed=s))])
            for i, s in enumerate((SEEDS[0], SEEDS[0], SEEDS[1]))
        ]
        first, again, other = (d[0].text for d in draws)
        assert first == again and first != other, (prompt, first, again, other)


def test_the_seed_is_measured_past_the_response_cache_on_servegates_runtime() -> None:
    result = contract_of(ServedModel.model_validate(CACHED))
    assert result.verdict == "pass", result.reason
    assert result.measurements.checked == {
        "seed": "measured: draws with different seeds differ at temperature 2.0, draws with the same seed are equal"
    }


def test_without_the_server_the_engine_level_seed_check_measures_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(contract, "default_app_factory", lambda: None)
    result = contract_of(ServedModel.model_validate(CACHED))
    assert result.verdict == "warn" and "HTTP contract was not checked" in result.reason
    assert result.measurements.http_checked is False
    assert result.measurements.checked["seed"].startswith("measured")
