"""What the contract gate says it checks on a remote, it checks by probing: the context the remote serves and
whether it honours the seed, measured where the remote does not report them; named "not verified" otherwise."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.drifting_remote import DriftingRemote, serve_app, unreported

from servegate.contracts.manifest import ServedModel
from servegate.gates.check import run_check
from servegate.gates.suites.output_cache import OutputCache

REFERENCE: dict[str, Any] = {
    "name": "gated",
    "weights": {"source": "zoo:tiny-primary"},
    "preprocess": {"chat_template": "none", "max_input_tokens": 64},
    "runtime": {"max_model_len": 128},
    "postprocess": {"max_output_tokens": 32},
    "quality": {"suites": [{"name": "arith", "dataset": "zoo:arith", "limit": 8, "public": True}]},
}


def endpoint(url: str, model: str = "remote", max_input_tokens: int = 64) -> ServedModel:
    """The reference manifest behind an endpoint at `url`; prompts up to 64 tokens by default (96 of context)."""
    data = json.loads(json.dumps(REFERENCE))
    data["runtime"].update(backend="endpoint", endpoint_url=url, endpoint_model=model)
    data["preprocess"]["max_input_tokens"] = max_input_tokens
    return ServedModel.model_validate(data)


def contract_of(candidate: ServedModel) -> Any:
    report = run_check(ServedModel.model_validate(REFERENCE), candidate, mode="change", forced=["contract"],
                       cache=OutputCache(enabled=False))  # fmt: skip
    [contract] = [g for g in report.gates if g.name == "contract"]
    return contract


def remote(**faults: Any) -> DriftingRemote:
    return DriftingRemote(unreported(), manifest=REFERENCE, **faults)


def test_an_honest_remote_that_reports_nothing_passes_with_both_fields_measured() -> None:
    with remote() as honest:
        contract = contract_of(endpoint(honest.url))
    assert contract.verdict == "pass", contract.reason
    checked = contract.measurements.checked
    assert checked["runtime.max_model_len"].startswith("measured: a prompt of 127 tokens")
    assert checked["seed"].startswith("measured")
    assert contract.measurements.not_verified is None
    assert "runtime.max_model_len" in contract.reason and "seed" in contract.reason
    assert contract.measurements.field_requests == 7  # one context probe, six seed draws
    assert any(len(b["prompt"]) == 127 and b["max_tokens"] == 1 for b in honest.bodies)


@pytest.mark.parametrize("over_context", ["refuse", "truncate"])
def test_a_remote_serving_96_tokens_of_a_declared_128_fails_the_contract_gate(over_context: str) -> None:
    """The issue's first remote, behind a front that sends up to 96 + 32 tokens; /v1/models says nothing, and no
    suite prompt or catalogue probe is long enough to show it."""
    with remote(context=96, over_context=over_context) as short:
        contract = contract_of(endpoint(short.url, max_input_tokens=96))
    assert contract.verdict == "fail", contract.reason
    assert "runtime.max_model_len declares 128 tokens" in contract.reason
    # the long prompt, then the longest request this front sends (96 prompt tokens, 32 to generate)
    expected = "refused a prompt of 96 tokens with 32" if over_context == "refuse" else "kept 64 of the 96"
    assert expected in contract.reason
    assert contract.measurements.field_requests == 8


def test_a_shorter_context_that_every_request_of_the_front_fits_is_named_not_verified() -> None:
    """64 + 32 tokens fit in 96: a 127-token prompt is refused, which a cap on prompts would explain too."""
    with remote(context=96) as short:
        contract = contract_of(endpoint(short.url))
    assert contract.verdict == "warn", contract.reason
    [missing] = contract.measurements.not_verified
    assert missing.startswith("runtime.max_model_len: the remote refused a prompt of 127 tokens")
    assert "the context is 96 tokens" in missing and "whether it serves 128 tokens is not known" in missing
    assert "not verified: runtime.max_model_len" in contract.reason


def test_a_remote_that_ignores_the_seed_fails_the_contract_gate() -> None:
    """The issue's second remote: at temperature 1 on suite prompts the zoo model's draws hardly differ."""
    with remote(honours_seed=False) as ignoring:
        contract = contract_of(endpoint(ignoring.url))
    assert contract.verdict == "fail", contract.reason
    assert "the same seed gave different outputs" in contract.reason
    seeds = {b.get("seed") for b in ignoring.bodies if b.get("temperature") == 2.0}
    assert seeds == {1234, 98765}  # the seeds were sent; the remote dropped them


def test_a_remote_whose_draws_never_differ_lists_the_seed_as_not_verified() -> None:
    with remote(samples=False) as greedy:
        contract = contract_of(endpoint(greedy.url))
    assert contract.verdict == "warn", contract.reason
    assert "not verified: seed" in contract.reason
    assert contract.measurements.not_verified[0].startswith("seed: draws with different seeds never differed")


def test_servegate_behind_the_endpoint_reports_its_context_and_passes() -> None:
    from servegate.server import create_app

    behind = ServedModel.model_validate({**REFERENCE, "name": "behind"})
    with serve_app(create_app(behind)) as url:
        contract = contract_of(endpoint(url + "/v1", model="behind"))
    assert contract.verdict == "pass", contract.reason
    checked = contract.measurements.checked
    assert checked["runtime.max_model_len"].startswith("reported: the remote reports max_model_len 128")
    assert checked["seed"].startswith("measured")


def test_servegate_behind_the_endpoint_with_a_shorter_context_fails_from_what_it_reports() -> None:
    from servegate.server import create_app

    data = json.loads(json.dumps({**REFERENCE, "name": "behind"}))
    data["runtime"]["max_model_len"] = 96
    with serve_app(create_app(ServedModel.model_validate(data))) as url:
        contract = contract_of(endpoint(url + "/v1", model="behind"))
    assert contract.verdict == "fail" and "the remote serves at most 96" in contract.reason


STRUCTURED = {**REFERENCE, "postprocess": {**REFERENCE["postprocess"], "structured_output": {"whitespace": "compact"}}}


@pytest.mark.parametrize("honours", [True, False])
def test_a_remote_that_drops_output_constraints_fails_the_contract_gate(honours: bool) -> None:
    with DriftingRemote(unreported(), manifest=STRUCTURED, honours_constraints=honours) as drifting:
        candidate = ServedModel.model_validate(
            {**endpoint(drifting.url).model_dump(), "postprocess": STRUCTURED["postprocess"]}
        )
        contract = contract_of(candidate)
        sent = [b["structured_outputs"] for b in drifting.bodies if "structured_outputs" in b]
    assert {next(iter(s)) for s in sent} == {"json_object", "json", "regex", "choice", "grammar"}
    measured = contract.measurements.constraints_under_load
    assert measured.target.startswith("the remote at")
    if honours:
        assert contract.verdict == "pass", contract.reason
        assert sum(p.broken for p in measured.phases) == 0
    else:
        assert contract.verdict == "fail" and "break their output constraint" in contract.reason, contract.reason
