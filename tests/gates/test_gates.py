"""Each gate catches its planted fault and passes its safe twin (on the fake engine and the zoo suites)."""

from __future__ import annotations

from support.oracle_engine import Faults, gate_result


def test_quantization_int2_fails_and_int8_passes(load, check) -> None:  # noqa: ANN001
    int8 = gate_result(check(load("base.yaml"), gates=("quantization",)), "quantization")
    int2 = gate_result(check(load("int2.yaml"), gates=("quantization",)), "quantization")
    assert int8.verdict == "pass", int8.reason
    assert int2.verdict == "fail", int2.reason
    assert "simulated" in int2.reason and int2.measurements.simulated is True
    arith = int2.measurements.suites["arith"].metrics["exact_match"]
    assert arith.n == 80 and arith.baseline_score == 1.0 and arith.candidate_score < 0.5
    assert arith.lower < arith.difference < arith.upper
    # failure examples: full text from public suites, only ids and lengths from private ones
    public = [e for e in int2.evidence if e["suite"] == "arith"]
    private = [e for e in int2.evidence if e["suite"] == "json"]
    assert public and public[0]["baseline"] != public[0]["candidate"] and "prompt" in public[0]
    assert private and "prompt" not in private[0] and "baseline" not in private[0] and "prompt_chars" in private[0]
    assert len(public) <= 5


def test_quantization_records_the_calibration_suite(load, check) -> None:  # noqa: ANN001
    served = load("base.yaml", "runtime.quantization.calibration=zoo:arith")
    result = gate_result(check(served, gates=("quantization",)), "quantization")
    calibration = result.measurements.calibration
    assert calibration is not None and calibration["suite"] == "zoo:arith"
    assert calibration["items"] > 0 and len(calibration["sha256"]) == 64


def test_truncation_that_cuts_recall_fails_and_a_safe_limit_passes(load, check) -> None:  # noqa: ANN001
    safe = gate_result(check(load("base.yaml"), gates=("truncation",)), "truncation")
    tight = gate_result(check(load("tight.yaml"), gates=("truncation",)), "truncation")
    assert safe.verdict == "pass", safe.reason
    assert safe.measurements.per_suite["recall"].over_limit == 0
    assert safe.measurements.per_suite["arith"].over_limit > 0
    assert tight.verdict == "fail", tight.reason
    assert tight.reason.startswith("recall/exact_match")
    recall = tight.measurements.per_suite["recall"]
    assert recall.share_over_limit == 1.0 and recall.tokens_lost_mean > 0
    assert recall.over_limit_scores is not None
    assert recall.over_limit_scores.full_context == 1.0 and recall.over_limit_scores.under_policy == 0.0


def test_truncation_reject_checks_that_users_get_input_too_long(load, check) -> None:  # noqa: ANN001
    result = gate_result(check(load("reject.yaml"), gates=("truncation",)), "truncation")
    arith = result.measurements.per_suite["arith"]
    assert arith.over_limit > 0 and arith.rejected == arith.over_limit
    assert result.verdict == "fail"  # rejected long arith prompts cost far more than the margin
    assert "arith" in result.reason


def test_caching_tenant_blind_cache_fails_and_tenant_scoped_passes(load, check) -> None:  # noqa: ANN001
    scoped = gate_result(check(load("base.yaml"), gates=("caching",)), "caching")
    blind = gate_result(check(load("base.yaml"), gates=("caching",), faults=Faults(tenant_blind_cache=True)), "caching")
    assert scoped.verdict == "pass", scoped.reason
    assert scoped.measurements.tenant_b_extra_hits == 0 and scoped.measurements.warm_prefix_hits > 0
    assert blind.verdict == "fail"
    assert "tenant B got" in blind.reason and blind.measurements.tenant_b_extra_hits > 0


def test_caching_global_scope_fails_with_tenants_and_warns_single_tenant(load, check) -> None:  # noqa: ANN001
    shared = gate_result(check(load("global-cache.yaml"), gates=("caching",)), "caching")
    single = gate_result(check(load("single-tenant-global.yaml"), gates=("caching",)), "caching")
    assert shared.verdict == "fail" and "tenants would see each other's entries" in shared.reason
    assert single.verdict == "warn" and "single tenant" in single.reason


def test_batching_order_bug_fails_and_a_correct_batcher_passes(load, check) -> None:  # noqa: ANN001
    good = gate_result(check(load("base.yaml"), gates=("batching",)), "batching")
    buggy = gate_result(check(load("base.yaml"), gates=("batching",), faults=Faults(batch_order_bug=True)), "batching")
    assert good.verdict == "pass", good.reason
    assert good.measurements.mismatch_rate == 0.0 and good.measurements.expired_request == "deadline_exceeded"
    assert buggy.verdict == "fail" and "outputs depend on the batch" in buggy.reason
    assert 0 < buggy.measurements.mismatch_rate < 1
    assert buggy.evidence and buggy.evidence[0]["arrangement"]


def test_fallback_that_breaks_the_output_schema_fails_and_the_declared_one_passes(load, check) -> None:  # noqa: ANN001
    good = gate_result(check(load("base.yaml"), gates=("fallback",)), "fallback")
    broken = gate_result(check(load("broken-fallback.yaml"), gates=("fallback",)), "fallback")
    assert good.verdict == "pass", good.reason
    overload, timeout = good.measurements.routing["overload"], good.measurements.routing["timeout"]
    assert overload.routed_to_fallback > 0 and overload.answered == overload.sent
    assert timeout.routed_to_fallback == timeout.sent
    assert good.measurements.boundaries["arith/exact_match"].verdict == "pass"
    assert broken.verdict == "fail"
    assert "json_schema_valid" in broken.reason


def test_quality_gate_runs_for_a_weights_change(load, check) -> None:  # noqa: ANN001
    base = load("reference.yaml")
    report = check(load("reference.yaml", "weights.source=zoo:tiny-fallback"), base)
    result = gate_result(report, "quality")
    assert "weights.source" in result.triggered_by[0]
    assert result.verdict == "pass"  # the fake model ignores the weights: same answers
    assert gate_result(report, "quantization").verdict == "skipped"
