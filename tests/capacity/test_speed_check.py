"""The speed check of `gate plan --verify`: lone requests, the profile's prediction against the measurement."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from capacity_helpers import STEP_MODEL, manifest

from servegate.capacity.bench.machine_speed import MachineSpeed
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.provenance import FitQuality, LoneReference
from servegate.capacity.latency.speed_check import SpeedCheck, lone_workload, predicted_lone_e2e_ms, profile_lone_bias
from servegate.capacity.latency.terms import StepCost
from servegate.contracts.capacity_section import LengthDistribution, Workload


def test_a_machine_at_its_profiled_speed_gets_one_line() -> None:
    check = SpeedCheck(predicted_ms=50.0, measured_ms=53.0, requests=8, profiled_at="2026-12-01T03:17")
    assert not check.drifted
    assert check.lines() == [
        "speed check: 8 lone requests took 53.0 ms (p50 end-to-end) against 50.0 ms expected from the profile "
        "of 2026-12-01T03:17: 1.06x"
    ]


def test_a_machine_slower_or_faster_than_profiled_is_named_with_the_remedy() -> None:
    slower = SpeedCheck(predicted_ms=50.0, measured_ms=75.0, requests=8)
    faster = SpeedCheck(predicted_ms=76.2, measured_ms=49.1, requests=8)
    assert slower.drifted and faster.drifted
    assert "1.50x" in slower.lines()[0] and "runs slower than when it was profiled" in slower.lines()[1]
    assert "0.64x" in faster.lines()[0] and "runs faster" in faster.lines()[1]
    assert "`gate profile` again" in faster.lines()[1]
    assert faster.as_dict()["drifted"] is True and faster.as_dict()["measured_over_expected"] == 49.1 / 76.2


def test_the_check_expects_lone_requests_to_run_against_the_model_as_they_did_when_profiled() -> None:
    profiled = LatencyModel(StepCost(c_step=0.002), fit=FitQuality(lone_reference=LoneReference(8, 17.0, 20.0)))
    assert profile_lone_bias(profiled) == 0.85
    assert profile_lone_bias(LatencyModel(StepCost(c_step=0.002))) == 1.0  # a profile from before it kept them
    same = SpeedCheck(predicted_ms=60.0, measured_ms=52.0, requests=8, bias=0.85)
    assert same.expected_ms == 51.0 and not same.drifted
    assert same.lines() == [
        "speed check: 8 lone requests took 52.0 ms (p50 end-to-end) against 51.0 ms expected from the profile "
        "(the prediction, 60.0 ms, x 0.85 as lone requests ran when profiled): 1.02x"
    ]
    assert same.as_dict()["profile_lone_bias"] == 0.85 and same.as_dict()["expected_e2el_p50_ms"] == 51.0
    # the same measurement against the bare prediction would have claimed a faster machine
    assert SpeedCheck(predicted_ms=60.0, measured_ms=52.0, requests=8).drifted


def test_the_lone_prediction_is_the_profile_for_one_request_at_a_time(model_dir: Path) -> None:
    workload = Workload(
        input_tokens=LengthDistribution(distribution="fixed", mean=16, max=16),
        output_tokens=LengthDistribution(distribution="fixed", mean=5, max=5),
        rate_rps=500.0,
        num_requests=40,
    )
    lone = lone_workload(workload)
    assert (lone.arrival, lone.concurrency, lone.num_requests) == ("closed", 1, 8)
    served = manifest(model_dir)
    predicted = predicted_lone_e2e_ms(served, STEP_MODEL, lone)
    # one step of 5-6 ms per output token, plus the prefill and the request overhead; no queueing at all
    assert 5 * 5.0 <= predicted <= 5 * 6.0 + 2.0 + 2.0 + 5.0
    twice = replace(STEP_MODEL, steps=STEP_MODEL.steps.scaled(2.0))
    assert predicted_lone_e2e_ms(served, twice, lone) > 1.7 * predicted  # steps twice as slow: nearly twice the time


def test_the_machine_line_compares_the_benchs_loop_time_with_the_profiles() -> None:
    from servegate.capacity.latency.speed_check import machine_comparison, machine_comparison_lines

    def bench(probe_us: float, fastest_us: float, slowest_us: float) -> dict[str, object]:
        """A bench report's machine_speed: its median and its fastest and slowest half-second medians."""
        return {"machine_speed": MachineSpeed(probe_us, {0: probe_us}, fastest_us, slowest_us, 80, 4.0).as_dict()}

    profiled = LatencyModel(
        StepCost(c_step=0.002), fit=FitQuality(machine_speed=MachineSpeed(200.0, {0: 200.0}, 195.0, 205.0, 80, 4.0))
    )
    same = machine_comparison(profiled, bench(210.0, 200.0, 210.0))
    assert same is not None and same["bench_over_profile"] == pytest.approx(1.05) and not same["moved"]
    assert machine_comparison_lines(same) == [
        "machine: a Python loop took 210 us during the bench against 200 us while profiling (1.05x; spread within "
        "the bench 1.05x): the same speed"
    ]
    slower = machine_comparison(profiled, bench(330.0, 300.0, 330.0))
    assert slower is not None and slower["moved"]
    assert "ran slower than when it was profiled" in machine_comparison_lines(slower)[1]
    moving = machine_comparison(profiled, bench(205.0, 150.0, 240.0))
    assert moving is not None and moving["moved"]
    assert "speed moved during the bench" in machine_comparison_lines(moving)[1]
    # nothing to compare: a profile from before it sampled the machine, or a bench that did not
    assert machine_comparison(LatencyModel(StepCost(c_step=0.002)), {"machine_speed": {"probe_us": 1.0}}) is None
    assert machine_comparison(profiled, {}) is None and machine_comparison_lines(None) == []
