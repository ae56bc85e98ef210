"""The load gate on the reference backend: planted faults that show only under concurrency are caught.

The engine is the zoo-solving test double (tests/support/oracle_engine.py) behind servegate's real HTTP app, driven over
httpx's ASGI transport exactly as it drives any server; each fault has its safe twin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.oracle_engine import Faults, gate_result

from servegate.contracts.manifest import ServedModel
from servegate.gates.probes.http_target import load_concurrency

SCHEMA = {"type": "object", "properties": {"sum": {"type": "string"}}, "required": ["sum"]}


def run_load(check: Callable[..., Any], served: ServedModel, faults: Faults = Faults()) -> Any:  # noqa: B008
    return gate_result(check(served, gates=("load",), faults=faults), "load")


def test_the_safe_engine_passes_with_every_sample_item_compared(load: Callable[..., ServedModel], check: Any) -> None:
    result = run_load(check, load("base.yaml"))
    assert result.verdict == "pass", result.reason
    m = result.measurements
    assert m.concurrency == 8 and m.concurrency_from == "batching.max_batch_size"
    assert m.quality.comparison == "token-exact" and m.quality.items == 18
    assert m.streaming.streams == 18 and m.streaming.answers == m.requests == 54
    assert m.streaming.token_count == "token ids"
    assert m.target == "servegate's server (in process)"


def test_outputs_that_change_when_requests_share_a_batch_fail(load: Callable[..., ServedModel], check: Any) -> None:
    result = run_load(check, load("base.yaml"), Faults(shared_batch_bug=True))
    assert result.verdict == "fail" and "outputs change under load" in result.reason
    assert result.measurements.quality.mismatches > 0
    assert result.evidence and result.evidence[0]["reference"] == "the same item sent alone"


def test_a_first_streamed_token_that_differs_from_the_final_text_fails(
    load: Callable[..., ServedModel], check: Any
) -> None:
    result = run_load(check, load("base.yaml"), Faults(stream_first_token_bug=True))
    assert result.verdict == "fail" and "streaming under load" in result.reason
    streaming = result.measurements.streaming
    assert streaming.first_token_mismatches == streaming.streams > 0
    assert result.measurements.quality.mismatches == 0  # the non-streamed answers are right


def test_usage_that_counts_one_token_too_many_fails(load: Callable[..., ServedModel], check: Any) -> None:
    result = run_load(check, load("base.yaml"), Faults(usage_extra=1))
    assert result.verdict == "fail" and "streaming under load" in result.reason
    assert result.measurements.streaming.usage_miscounts > 0


def test_the_declared_closed_loop_concurrency_is_the_load(load: Callable[..., ServedModel]) -> None:
    served = load("base.yaml")
    workload = {"arrival": "closed", "concurrency": 5, "num_requests": 10}
    closed = served.with_changes(capacity={"workload": workload})
    assert load_concurrency(closed) == (5, "capacity.workload.concurrency")
    assert load_concurrency(served) == (8, "batching.max_batch_size")


def with_schema(served: ServedModel, **post: Any) -> ServedModel:
    """The json suite alone, with its answers' schema declared (every other suite answers plain text)."""
    data = served.postprocess.model_dump(mode="python")
    quality = served.quality.model_dump(mode="python")
    quality["suites"] = [s for s in quality["suites"] if s["name"] == "json"]
    return served.with_changes(postprocess={**data, "output_schema": SCHEMA, **post}, quality=quality)


@pytest.mark.parametrize("breaks", [0, 4])
def test_json_that_breaks_only_above_concurrency_4_fails_the_contract_gate(
    load: Callable[..., ServedModel], check: Any, breaks: int
) -> None:
    report = check(with_schema(load("base.yaml")), gates=("contract",), faults=Faults(json_breaks_above=breaks))
    contract = gate_result(report, "contract")
    phases = contract.measurements.structured_under_load.phases
    assert [(p.concurrency, p.stream) for p in phases] == [(1, False), (1, True), (8, False), (8, True)]
    assert phases[0].validity == phases[1].validity == 1.0  # the json suite alone: always valid
    if breaks:
        assert contract.verdict == "fail" and "structured output breaks under load" in contract.reason
        assert phases[2].validity < 0.5 and phases[3].validity < 0.5
    else:  # the oracle engine answers alike at every temperature: only the seed is left unmeasured, and said
        assert contract.verdict == "warn", contract.reason
        assert [n.split(":")[0] for n in contract.measurements.not_verified] == ["seed"]
        assert phases[2].validity == phases[3].validity == 1.0


def test_an_answer_over_max_output_bytes_fails_the_contract_gate(load: Callable[..., ServedModel], check: Any) -> None:
    within = gate_result(check(with_schema(load("base.yaml"), max_output_bytes=64), gates=("contract",)), "contract")
    assert within.verdict == "warn" and within.reason.endswith("would look the same)"), within.reason  # the seed
    over = gate_result(check(with_schema(load("base.yaml"), max_output_bytes=8), gates=("contract",)), "contract")
    assert over.verdict == "fail" and "over postprocess.max_output_bytes 8" in over.reason
    assert all(p.bytes_max == 14 for p in over.measurements.structured_under_load.phases)


def test_items_that_differ_only_from_a_numerical_tie_on_warn_and_are_counted_apart(
    load: Callable[..., ServedModel], check: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate hands each token-exact mismatch, with the server's token ids, to the tie judgement (batching_ties):
    judged ties leave the mismatches for `numerical_ties` and the gate warns; the same run judged otherwise fails."""
    from servegate.gates.checks import batching_ties

    judged: list[Any] = []

    def all_ties(ctx: Any, reference: ServedModel, mismatched: Any) -> list[batching_ties.Divergence]:
        judged.extend(mismatched)
        return [batching_ties.Divergence(r.id, 0, 1e-5) for r, _, _ in mismatched]

    monkeypatch.setattr(batching_ties, "judge_divergences", all_ties)
    result = run_load(check, load("base.yaml"), Faults(shared_batch_bug=True))
    quality = result.measurements.quality
    # this fault also breaks the streams (the gate still fails for that), but no longer for the outputs
    assert result.verdict == "fail" and "outputs change under load" not in result.reason, result.reason
    assert quality.mismatches == 0 and quality.numerical_ties == len(judged) > 0
    request, rest, under_load = judged[0]
    assert request.params.temperature == 0.0 and rest.token_ids and rest.token_ids != under_load.token_ids
    # with the streams whole, ties alone warn
    from servegate.gates.checks.load import LoadGate

    m = result.measurements
    whole = m.model_copy(update={"streaming": m.streaming.model_copy(update={"twin_mismatches": 0})})
    verdict = LoadGate()._verdict(whole, [None] * quality.items, [], None, [], [])  # type: ignore[list-item]
    assert verdict.verdict == "warn" and "differ only from a numerical tie on" in verdict.reason, verdict.reason
