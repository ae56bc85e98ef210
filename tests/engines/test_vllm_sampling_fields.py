"""Penalties, logit_bias, min_tokens, stop_token_ids, include_stop_str_in_output and skip_special_tokens give the
same greedy output on servegate's reference runtime and on vLLM, on the same fp32 weights: the fields mean what
vLLM means, and the endpoint backend forwards them (a remote that dropped one would answer as if it were not
sent).

For each field set, the items whose reference answer the field changes (against plain greedy) are the
evidence: vLLM must give those changed answers, text and finish reason, on at least 95% of them (fp32 near-ties
aside; the plain parity test holds at 100%), and the field must change at least 5 answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engines_support import endpoint_manifest, reference_manifest

from servegate.contracts.quality_section import Suite
from servegate.gates.suites.evaluation import load_suite_data
from servegate.runtime import build
from servegate.runtime.model.weights import load_tokenizer
from servegate.runtime.remote.vllm_process import VllmServer
from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams

pytestmark = pytest.mark.engines

ITEMS = 60


def field_sets(tokenizer: Any) -> dict[str, dict[str, Any]]:
    """The shaped requests compared: each asks for one field (or one pair that vLLM applies together)."""
    [five] = tokenizer("5", add_special_tokens=False)["input_ids"]
    [six] = tokenizer("6", add_special_tokens=False)["input_ids"]
    return {
        "logit_bias": {"logit_bias": ((five, 4.0),)},
        # past EOS, so the answer runs long enough to repeat itself
        "presence+frequency": {"presence_penalty": 1.5, "frequency_penalty": 1.0, "ignore_eos": True},
        "repetition_penalty": {"repetition_penalty": 1.6, "ignore_eos": True},
        "min_tokens": {"min_tokens": 6},
        "stop_token_ids": {"stop_token_ids": (six,)},
        "include_stop_str": {"stop": ("5",), "include_stop_str": True},
        # <bos> (id 1) is special: pushed in, it shows only when special tokens are written
        "skip_special_tokens": {"logit_bias": ((1, 100.0),), "skip_special_tokens": False},
    }


def answers(engine: Any, prompts: list[str], **fields: Any) -> list[tuple[str, str]]:
    """(text, finish reason) of each prompt's greedy answer (text, as the parity test: a remote's token ids may
    or may not carry the final EOS)."""
    params = SamplingParams(max_tokens=12, **fields)
    results = engine.generate([GenerationRequest(f"r{i}", prompt=p, params=params) for i, p in enumerate(prompts)])
    assert all(isinstance(r, FinishEvent) for r in results), [r for r in results if not isinstance(r, FinishEvent)]
    return [(r.text, r.finish_reason) for r in results]  # type: ignore[union-attr]


def test_vllm_and_the_reference_runtime_agree_on_the_answers_each_sampling_field_changes(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    reference_served = reference_manifest(tmp_path)
    data = load_suite_data(reference_served, Suite(name="arith", dataset="zoo:arith"))
    prompts = [item.prompt for item in data.items[:ITEMS]]
    reference, remote = build(reference_served), build(endpoint_manifest(tmp_path, vllm_server))
    try:
        plain = {eos: answers(reference, prompts, ignore_eos=eos) for eos in (False, True)}
        for name, fields in field_sets(load_tokenizer(reference_served)).items():
            ours, theirs = answers(reference, prompts, **fields), answers(remote, prompts, **fields)
            unshaped = plain[fields.get("ignore_eos", False)]
            changed = [i for i in range(len(prompts)) if ours[i] != unshaped[i]]
            agree = sum(ours[i] == theirs[i] for i in changed)
            print(f"\n{name}: changes {len(changed)} of {len(prompts)} answers; vLLM gives {agree} of them")
            assert len(changed) >= 5, f"{name} changed too few reference answers to show anything"
            first = next((i for i in changed if ours[i] != theirs[i]), None)
            shown = "" if first is None else f"; first: reference {ours[first]!r}, vLLM {theirs[first]!r}"
            assert agree >= 0.95 * len(changed), (
                f"{name}: vLLM agrees on {agree} of {len(changed)} changed answers{shown}"
            )
    finally:
        reference.shutdown_sync()
