"""Output constraints on the reference engine (the zoo's tiny-primary, its real tokenizer): every finished output
satisfies its constraint in every batching mode, a constrained row gives the same tokens alone and in a busy
batch, greedy choice decoding equals an independent oracle, and every bad constraint is a declared 400."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import torch
from support.manifests import BATCHING_MODES, real_manifest

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.requests import parse_request
from servegate.runtime import build
from servegate.runtime.request_translator import engine_requests
from servegate.runtime.types import ErrorEvent, FinishEvent, Result

pytest.importorskip("llguidance")

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
CHOICES = ["yes", "no", "maybe", "nope"]
REGEX = r"[0-9]{2,4}-[a-c]+"
GRAMMAR = 'start: "(" num ("+" num)* ")"\nnum: /[0-9]/'

MODES = BATCHING_MODES


def manifest(
    structured: dict[str, Any] | None = None, post: dict[str, Any] | None = None, **sections: Any
) -> ServedModel:
    """tiny-primary with structured output declared (compact JSON: a random model would pad with blanks)."""
    declared = {"whitespace": "compact", **(structured or {})}
    post = {"max_output_tokens": 48, "logprobs": True, "structured_output": declared, **(post or {})}
    return ServedModel.model_validate(real_manifest("zoo:tiny-primary", postprocess=post, **sections))


def bodies() -> list[dict[str, Any]]:
    """One body per constraint kind and spelling, greedy and sampled, with unconstrained neighbours."""
    base = {"model": "tiny", "prompt": "12+34=", "max_tokens": 48}
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    return [
        {**base, "temperature": 0, "response_format": fmt},
        {**base, "temperature": 1.0, "seed": 4, "response_format": fmt},
        {**base, "temperature": 1.0, "seed": 5, "response_format": {"type": "json_object"}, "max_tokens": 24},
        {**base, "temperature": 1.0, "seed": 6, "structured_outputs": {"regex": REGEX}},
        {**base, "temperature": 1.0, "seed": 7, "n": 3, "guided_choice": CHOICES},
        {**base, "temperature": 0, "structured_outputs": {"choice": CHOICES}},
        {**base, "temperature": 1.0, "seed": 8, "guided_grammar": GRAMMAR},
        {**base, "temperature": 1.0, "seed": 9, "guided_json": json.dumps(SCHEMA)},
        {**base, "temperature": 1.0, "seed": 10},
        {**base, "temperature": 0, "max_tokens": 12},
    ]


def run(served: ServedModel, listed: list[dict[str, Any]]) -> list[Result]:
    engine = build(served)
    try:
        requests = []
        for i, body in enumerate(listed):
            requests += engine_requests(served, parse_request(served, "completions", body), f"r{i}", None)
        return engine.generate(requests)
    finally:
        engine.shutdown_sync()


def satisfies(body: dict[str, Any], text: str) -> bool:
    """Whether a finished output satisfies its body's constraint (checked here by other code than the mask)."""
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema" or "guided_json" in body:
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    if fmt.get("type") == "json_object":
        return isinstance(json.loads(text), dict)
    so = body.get("structured_outputs") or {}
    if "regex" in so:
        return re.fullmatch(REGEX, text) is not None
    if "choice" in so or "guided_choice" in body:
        return text in CHOICES
    if "guided_grammar" in body:
        return re.fullmatch(r"\([0-9](\+[0-9])*\)", text) is not None
    return True


@pytest.fixture(scope="module")
def continuous_results() -> list[Result]:
    return run(manifest(), bodies())


@pytest.mark.parametrize("mode", list(MODES))
def test_every_finished_output_satisfies_its_constraint_in_every_batching_mode(
    mode: str, continuous_results: list[Result]
) -> None:
    listed = bodies()
    results = continuous_results if mode == "continuous" else run(manifest(**MODES[mode]), listed)
    per_body = [body for body in listed for _ in range(body.get("n", 1))]
    finished = 0
    for body, result in zip(per_body, results, strict=True):
        if result.finish_reason == "eos":
            finished += 1
            assert satisfies(body, result.text), (body, result.text)
    assert finished >= 9, [r.text for r in results]
    # the same tokens in every mode: a row's mask is its own, whatever the batch
    assert [r.token_ids for r in results] == [r.token_ids for r in continuous_results]


def test_a_constrained_request_alone_gives_the_tokens_it_gives_in_a_busy_batch(
    continuous_results: list[Result],
) -> None:
    alone = run(manifest(), [bodies()[1]])
    assert alone[0].token_ids == continuous_results[1].token_ids


def oracle_choice(served: ServedModel, prompt: str, choices: list[str], eos: int) -> str:
    """Greedy decoding restricted to continuations of the choices, from transformers' own forward pass (the
    zoo tokenizer reads one character per token)."""
    from servegate.runtime.model.weights import load_causal_lm

    loaded = load_causal_lm(served)
    model, tok = loaded.model, loaded.tokenizer
    ids = tok.encode(prompt)
    text = ""
    while True:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        nexts = {c[len(text)] for c in choices if c.startswith(text) and len(c) > len(text)}
        allowed = {tok.convert_tokens_to_ids(char) for char in nexts}
        if text in choices:
            allowed.add(eos)
        best = max(allowed, key=lambda t: float(logits[t]))
        if best == eos:
            return text
        text += tok.decode([best])
        ids.append(best)


def test_greedy_choice_equals_an_oracle_restricted_to_the_choices(continuous_results: list[Result]) -> None:
    served = manifest()
    assert continuous_results[7].text == oracle_choice(served, "12+34=", CHOICES, eos=2)


def test_a_forced_token_has_log_probability_zero_as_vllm_reports_the_masked_distribution() -> None:
    served = manifest()
    body = {"model": "tiny", "prompt": "1+1=", "max_tokens": 8, "temperature": 0, "logprobs": 0}
    result = run(served, [{**body, "guided_choice": ["42"]}])[0]
    assert result.text == "42" and result.finish_reason == "eos"
    assert result.logprobs is not None and [round(v, 6) for v in result.logprobs] == [0.0, 0.0, 0.0]


def test_the_manifest_schema_is_enforced_on_requests_that_bring_none() -> None:
    flag = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    flag["additionalProperties"] = False
    served = manifest(structured={"enforce_output_schema": True}, post={"output_schema": flag})
    body = {"model": "tiny", "prompt": "x", "max_tokens": 48, "temperature": 1.0}
    results = run(served, [{**body, "seed": seed} for seed in range(4)])
    assert {r.text for r in results} <= {'{"ok":true}', '{"ok":false}'}
    closed = manifest(
        structured={"enforce_output_schema": True, "request_constraints": False}, post={"output_schema": flag}
    )
    assert refusal(closed, {"guided_regex": "[0-9]"}) == ("unsupported_parameter", "guided_regex")


def refusal(served: ServedModel, body: dict[str, Any]) -> tuple[str, str | None]:
    """The declared error a body gets: at parsing, or from the engine (a constraint that does not compile)."""
    full = {"model": "tiny", "prompt": "x", "max_tokens": 4, **body}
    try:
        parse_request(served, "completions", full)
    except ServingError as exc:
        return exc.code, exc.param
    (result,) = run(served, [full])
    assert isinstance(result, ErrorEvent), result
    return result.error.code, result.error.param


def test_every_bad_constraint_is_a_declared_400_naming_its_field() -> None:
    served = manifest(structured={"kinds": ["json_schema", "regex"], "max_spec_bytes": 64})
    assert refusal(served, {"guided_regex": "(("}) == ("invalid_constraint", "guided_regex")
    assert refusal(served, {"guided_json": {"type": "nonsense"}}) == ("invalid_constraint", "guided_json")
    assert refusal(served, {"guided_json": {"type": "string", "format": "weird"}}) == (
        "invalid_constraint",
        "guided_json",
    )
    assert refusal(served, {"guided_regex": "a" * 65}) == ("invalid_constraint", "guided_regex")
    assert refusal(served, {"guided_choice": ["a"]}) == ("unsupported_parameter", "guided_choice")
    assert refusal(served, {"guided_regex": "a", "structured_outputs": {"regex": "b"}}) == (
        "invalid_request",
        "guided_regex",
    )
    assert refusal(served, {"guided_regex": "a", "ignore_eos": True}) == ("invalid_request", "ignore_eos")
    assert refusal(served, {"guided_regex": "a+", "min_tokens": 2}) == ("invalid_request", "min_tokens")
    assert refusal(served, {"guided_json": "{not json"}) == ("invalid_request", "guided_json")
    assert refusal(served, {"response_format": {"type": "json_schema"}}) == (
        "invalid_request",
        "response_format.json_schema",
    )
    undeclared = ServedModel.model_validate(real_manifest("zoo:tiny-primary"))
    assert refusal(undeclared, {"response_format": {"type": "json_object"}}) == (
        "unsupported_parameter",
        "response_format",
    )
    # text asks for nothing, on any deployment
    parse_request(undeclared, "completions", {"model": "tiny", "prompt": "x", "response_format": {"type": "text"}})


def test_enforcing_the_output_schema_needs_one() -> None:
    with pytest.raises(ValueError, match="needs an output_schema"):
        manifest(structured={"enforce_output_schema": True})


def test_a_mask_that_lets_one_illegal_token_through_is_caught_by_the_final_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from servegate.runtime.model.grammar_mask import GrammarMask

    served = manifest()
    real = GrammarMask.allowed
    calls = {"n": 0}

    def leaky(self: GrammarMask, matchers: Any, width: int) -> torch.Tensor:
        allowed = real(self, matchers, width)
        calls["n"] += 1
        if calls["n"] == 3:  # the third step lets 'x' through as well
            allowed[:, X] = True
        return allowed

    from transformers import AutoTokenizer

    from servegate.zoo import zoo_model_path

    X = AutoTokenizer.from_pretrained(zoo_model_path("tiny-primary")).convert_tokens_to_ids("x")
    body = {"model": "tiny", "prompt": "1", "max_tokens": 48, "temperature": 0, "logit_bias": {str(X): 100}}
    flag = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    [safe] = run(served, [{**body, "guided_json": flag}])
    assert isinstance(safe, FinishEvent) and "x" not in safe.text  # a bias cannot push a masked token
    monkeypatch.setattr(GrammarMask, "allowed", leaky)
    [leaked] = run(served, [{**body, "guided_json": flag}])
    assert isinstance(leaked, ErrorEvent) and leaked.error.code == "invalid_output", leaked
    assert "guided_json" in leaked.error.message
