"""What the datasheet reports about a trained zoo model, measured on the committed suites.

Exact match per suite and quantization variant, the json suite's schema-valid rate, agreement
of each variant's completions with fp32, and exact match under truncation at the documented limits.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from servegate.zoo import tasks
from servegate.zoo.eval_suites import json_output_schema, load_suite
from servegate.zoo.quant_variants import SIMULATED, VARIANTS, quantized_copy
from servegate.zoo.scoring import exact_match_rate, greedy_completions

CAUSAL_SUITES: tuple[str, ...] = ("arith", "recall", "json")
# The tests re-measure the first SAMPLE_SIZE items of each suite with plain model.generate.
SAMPLE_SIZE = 100
TRUNCATIONS: dict[str, tuple[str, int]] = {
    f"left@{tasks.SAFE_MAX_INPUT_TOKENS}": ("left", tasks.SAFE_MAX_INPUT_TOKENS),
    f"left@{tasks.TIGHT_MAX_INPUT_TOKENS}": ("left", tasks.TIGHT_MAX_INPUT_TOKENS),
    f"right@{tasks.TIGHT_MAX_INPUT_TOKENS}": ("right", tasks.TIGHT_MAX_INPUT_TOKENS),
}


def schema_valid_rate(completions: list[str]) -> float:
    """Share of completions that parse as JSON and satisfy the json suite's schema."""
    validator = jsonschema.Draft202012Validator(json_output_schema())
    valid = 0
    for text in completions:
        try:
            valid += validator.is_valid(json.loads(text))
        except ValueError:
            pass
    return valid / len(completions) if completions else 0.0


def _round(value: float) -> float:
    return round(value, 4)


def measure(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, limit: int | None = None) -> dict[str, Any]:
    """All datasheet figures for ``model`` on the test splits (the first ``limit`` items of each)."""
    suites = {name: load_suite(name, "test", limit) for name in CAUSAL_SUITES}
    prompts = {name: [item["prompt"] for item in items] for name, items in suites.items()}
    references = {name: [item["reference"] for item in items] for name, items in suites.items()}
    exact: dict[str, dict[str, float]] = {}
    sample: dict[str, dict[str, float]] = {}
    schema_valid: dict[str, float] = {}
    agreement: dict[str, dict[str, float]] = {}
    fp32_outputs: dict[str, list[str]] = {}
    for variant in VARIANTS:
        candidate = quantized_copy(model, variant)
        exact[variant], sample[variant], agreement[variant] = {}, {}, {}
        for name in CAUSAL_SUITES:
            outputs = greedy_completions(candidate, tokenizer, prompts[name])
            if variant == "none":
                fp32_outputs[name] = outputs
            exact[variant][name] = _round(exact_match_rate(outputs, references[name]))
            sample[variant][name] = _round(exact_match_rate(outputs[:SAMPLE_SIZE], references[name][:SAMPLE_SIZE]))
            agreement[variant][name] = _round(exact_match_rate(outputs, fp32_outputs[name]))
            if name == "json":
                schema_valid[variant] = _round(schema_valid_rate(outputs))
    truncation: dict[str, dict[str, float]] = {}
    for label, (side, max_tokens) in TRUNCATIONS.items():
        truncation[label] = {
            name: _round(
                exact_match_rate(
                    greedy_completions(model, tokenizer, prompts[name], max_input_tokens=max_tokens, truncation=side),
                    references[name],
                )
            )
            for name in CAUSAL_SUITES
        }
    over = {
        name: {
            str(limit_tokens): sum(item["prompt_tokens"] > limit_tokens for item in items)
            for limit_tokens in (tasks.SAFE_MAX_INPUT_TOKENS, tasks.TIGHT_MAX_INPUT_TOKENS)
        }
        for name, items in suites.items()
    }
    return {
        "items": {name: len(items) for name, items in suites.items()},
        "exact_match": exact,
        "exact_match_first_100": sample,
        "json_schema_valid": schema_valid,
        "agreement_with_fp32": agreement,
        "truncation_exact_match": truncation,
        "items_over_limit": over,
        "simulated_variants": sorted(SIMULATED),
    }
