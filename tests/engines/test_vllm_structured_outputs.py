"""Output constraints give the same greedy answers on servegate's reference runtime (llguidance's mask) and on
vLLM (xgrammar: inside vLLM, llguidance does not read this character tokenizer; the session's server is
launched with compact JSON, `disable_any_whitespace`, which vLLM sets per server), on the same fp32 weights,
and vLLM's answers pass the endpoint backend's check after the fact.

For each constraint, every item's answer must satisfy it on both sides; vLLM must give the reference's text and
finish reason on at least 95% of the items (fp32 near-ties aside), and the constraint must change at least 5
reference answers (against plain greedy), so that it is seen doing something.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest
from engines_support import STRUCTURED, endpoint_manifest, reference_manifest
from support.drifting_remote import serve_app

from servegate.contracts.constraint_fields import OutputConstraint
from servegate.contracts.quality_section import Suite
from servegate.gates.suites.evaluation import load_suite_data
from servegate.runtime import build
from servegate.runtime.remote.vllm_process import VllmServer
from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams
from servegate.server import create_app

pytestmark = pytest.mark.engines

ITEMS = 60
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
CONSTRAINTS = {
    "json_schema": OutputConstraint("json_schema", json.dumps(ANSWER), "guided_json", compact=True),
    "regex": OutputConstraint("regex", "[0-9]{2,3}", "guided_regex"),
    "choice": OutputConstraint("choice", json.dumps(["12", "579", "1000", "0"]), "guided_choice"),
}


def satisfied(name: str, text: str) -> bool:
    if name == "json_schema":
        value = json.loads(text)
        return set(value) == {"answer"} and isinstance(value["answer"], int)
    if name == "regex":
        return re.fullmatch("[0-9]{2,3}", text) is not None
    return text in json.loads(CONSTRAINTS["choice"].spec)


def answers(engine: Any, prompts: list[str], constraint: OutputConstraint | None) -> list[tuple[str, str]]:
    """(text, finish reason) of each prompt's greedy answer; every one a result (not an invalid_output)."""
    params = SamplingParams(max_tokens=16, constraint=constraint)
    results = engine.generate([GenerationRequest(f"r{i}", prompt=p, params=params) for i, p in enumerate(prompts)])
    assert all(isinstance(r, FinishEvent) for r in results), [r for r in results if not isinstance(r, FinishEvent)]
    return [(r.text, r.finish_reason) for r in results]  # type: ignore[union-attr]


def test_vllm_and_the_reference_runtime_give_the_same_constrained_answers(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    reference_served = reference_manifest(tmp_path, postprocess=STRUCTURED)
    data = load_suite_data(reference_served, Suite(name="arith", dataset="zoo:arith"))
    prompts = [item.prompt for item in data.items[:ITEMS]]
    reference = build(reference_served)
    remote = build(endpoint_manifest(tmp_path, vllm_server, postprocess=STRUCTURED))
    try:
        plain = answers(reference, prompts, None)
        failures = []
        for name, constraint in CONSTRAINTS.items():
            ours, theirs = answers(reference, prompts, constraint), answers(remote, prompts, constraint)
            for side, got in (("reference", ours), ("vLLM", theirs)):
                broken = [text for text, reason in got if reason == "eos" and not satisfied(name, text)]
                if broken:
                    failures.append(f"{name}: {side} answers break the constraint: {broken[:3]}")
            changed = sum(ours[i] != plain[i] for i in range(len(prompts)))
            agree = sum(a == b for a, b in zip(ours, theirs, strict=True))
            ended = sum(reason == "eos" for _, reason in ours)
            print(
                f"\n{name}: changes {changed} of {len(prompts)} answers, {ended} end at EOS; "
                f"vLLM gives the same {agree}"
            )
            if changed < 5:
                failures.append(f"{name} changed too few reference answers ({changed}) to show anything")
            first = next(((a, b) for a, b in zip(ours, theirs, strict=True) if a != b), None)
            if agree < 0.95 * len(prompts):
                failures.append(f"{name}: vLLM agrees on {agree}; first difference {first}")
        assert not failures, failures
    finally:
        reference.shutdown_sync()


class Flag(pydantic.BaseModel):
    """A short answer the tiny model ends well within its tokens."""

    ok: bool


def test_the_openai_parse_helper_works_through_gate_serve_in_front_of_vllm(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    served = endpoint_manifest(tmp_path, vllm_server, postprocess=STRUCTURED)
    # zoo:tiny-primary has no chat template: messages are joined as plain text
    served = served.with_changes(preprocess={**served.preprocess.model_dump(mode="python"), "chat_template": "none"})
    with serve_app(create_app(served)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        parsed = client.chat.completions.parse(
            model=served.name,
            messages=[{"role": "user", "content": "1+1="}],
            response_format=Flag,
            max_tokens=16,
            temperature=0,
        )
        assert isinstance(parsed.choices[0].message.parsed, Flag), parsed
        picked = client.completions.create(
            model=served.name, prompt="12+34=", max_tokens=8, temperature=0, extra_body={"guided_choice": ["46", "64"]}
        )
        assert picked.choices[0].text in ("46", "64") and picked.choices[0].finish_reason == "stop"
