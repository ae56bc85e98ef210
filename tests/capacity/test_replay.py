"""The simulator replaying measured steps, the step model against measured steps, and prediction intervals."""

from __future__ import annotations

import numpy as np
import pytest

from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.bench.workload import RequestSpec, make_requests
from servegate.capacity.latency.interval import prediction_interval
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.replay import (
    admission_delays,
    replay_durations,
    replay_run,
    specs_of_run,
    step_cost_errors,
    step_kind,
    steps_in,
    way_out_delays,
)
from servegate.capacity.latency.simulate import SimSetup, simulate
from servegate.capacity.latency.step_fit import ServingStep
from servegate.capacity.latency.terms import ServingOverheads, StepCost, StepJitter
from servegate.contracts.capacity_section import Workload

MODEL = LatencyModel(
    StepCost(c_step=0.004, c_prefill_token=0.0002, c_decode_seq=0.001),
    ServingOverheads(request_s=0.002, finish_s=0.0005),
    StepJitter(spread=0.3, correlation=0.5),
)
SETUP = SimSetup("continuous", 8, 0.0, 512, False, num_blocks=256, block_size=16)


def specs(rate: float = 40.0, n: int = 120, seed: int = 3) -> list[RequestSpec]:
    workload = Workload.model_validate(
        {
            "input_tokens": {"distribution": "uniform", "mean": 40, "min": 8, "max": 72},
            "output_tokens": {"distribution": "uniform", "mean": 12, "min": 4, "max": 20},
            "rate_rps": rate,
            "num_requests": n,
        }
    )
    return make_requests(workload, seed)


def test_replaying_a_synthetic_trace_reproduces_its_percentiles_exactly() -> None:
    # the "measured" run: noisy steps (30% jitter, correlated); its durations are the trace
    measured = simulate(SETUP, MODEL, specs(), seed=7)
    replayed = replay_run(SETUP, MODEL, specs(), measured.step_seconds)
    a, b = measured.summary(), replayed.summary()
    for metric in ("ttft_ms", "e2el_ms", "itl_ms"):
        for p in ("p50", "p95", "p99"):
            assert b[metric][p] == a[metric][p]
    # the jitter-free prediction differs: the replay is not the model's own answer
    assert simulate(SETUP, MODEL, specs(), jitter=False).summary()["e2el_ms"]["p99"] != a["e2el_ms"]["p99"]


def test_a_trace_with_admission_times_replays_exactly_whatever_the_models_overheads() -> None:
    # the "measured" engine: noisy steps, and a way in from the client that no model overhead describes
    # (lognormal, 1-40 ms); the trace records when the engine admitted each request, by the id it answered with
    run_specs = specs()
    way_in = np.random.default_rng(11).lognormal(np.log(0.006), 0.8, len(run_specs)).clip(0.001, 0.04)
    measured = simulate(SETUP, MODEL, run_specs, seed=7, admission_delays=list(way_in))
    first = 5000.0  # the client's perf_counter at the first scheduled send
    records = [RequestRecord(scheduled=first + s.arrival_s, request_id=f"cmpl-{i}") for i, s in enumerate(run_specs)]
    admissions = [
        {"request": f"cmpl-{i}", "admitted": r.scheduled + d}
        for i, (r, d) in enumerate(zip(records, way_in, strict=True))
    ]
    delays = admission_delays(records, admissions[::-1])  # found by id, whatever the order
    assert delays == pytest.approx(list(way_in), abs=1e-9)
    # a model whose request overhead and admission delay are far off changes nothing once admissions are replayed
    wrong = LatencyModel(
        MODEL.steps, ServingOverheads(request_s=0.05, finish_s=0.0005, admission_delay_per_running_s=0.01), MODEL.jitter
    )
    run = specs_of_run(run_specs, records)
    replayed = replay_run(SETUP, wrong, run, measured.step_seconds, delays)
    a, b = measured.summary(), replayed.summary()
    for metric in ("ttft_ms", "e2el_ms", "itl_ms"):
        for p in ("p50", "p95", "p99"):
            assert b[metric][p] == pytest.approx(a[metric][p], rel=1e-9)
    assert replayed.steps == measured.steps
    # without them (a trace written before admissions were recorded) the model's way in is replayed, and is off
    old = replay_run(SETUP, wrong, run, measured.step_seconds, admission_delays(records, []))
    assert (
        old.summary()["ttft_ms"]["p50"]
        == replay_run(SETUP, wrong, run, measured.step_seconds).summary()["ttft_ms"]["p50"]
    )
    assert old.summary()["ttft_ms"]["p50"] > 1.5 * a["ttft_ms"]["p50"]


def test_admission_delays_take_refusals_and_leave_unmatched_requests_to_the_model() -> None:
    records = [
        RequestRecord(scheduled=1.0, request_id="a"),
        RequestRecord(scheduled=2.0),
        RequestRecord(3.0, request_id="c"),
    ]
    admissions = [
        {"request": "a", "admitted": 1.25},
        {"request": "c", "refused": 3.5},
        {"request": "x", "admitted": 9.0},
    ]
    assert admission_delays(records, admissions) == [0.25, None, 0.5]


def test_a_trace_with_admissions_and_ways_out_replays_the_clients_latencies_exactly() -> None:
    # the "measured" engine: noisy steps, a way in and a way out (engine handoff -> client) no model overhead
    # describes; the trace records each admission and each first-token and final handoff, by the answered id
    run_specs = specs()
    rng = np.random.default_rng(13)
    way_in = rng.lognormal(np.log(0.006), 0.8, len(run_specs)).clip(0.001, 0.04)
    first_out = rng.lognormal(np.log(0.008), 0.8, len(run_specs)).clip(0.001, 0.04)
    final_out = rng.lognormal(np.log(0.004), 0.8, len(run_specs)).clip(0.0005, 0.03)
    injected = list(zip(first_out.tolist(), final_out.tolist(), strict=True))
    measured = simulate(SETUP, MODEL, run_specs, seed=7, admission_delays=list(way_in), way_out=injected)
    first = 5000.0  # the client's perf_counter at the first scheduled send
    records = [
        RequestRecord(
            scheduled=first + s.arrival_s,
            token_times=[first + t for t in m.token_times],
            end=first + m.end,
            request_id=f"cmpl-{i}",
        )
        for i, (s, m) in enumerate(zip(run_specs, measured.records, strict=True))
    ]
    assert all(r.ok for r in records)
    admissions = [
        {"request": f"cmpl-{i}", "admitted": r.scheduled + d}
        for i, (r, d) in enumerate(zip(records, way_in, strict=True))
    ]
    handoffs = []
    for i, (r, (f, e)) in enumerate(zip(records, injected, strict=True)):
        handoffs += [
            {"request": f"cmpl-{i}", "first_token": r.token_times[0] - f},
            {"request": f"cmpl-{i}", "finished": r.end - e},
        ]
    way_out = way_out_delays(records, handoffs[::-1])  # found by id, whatever the order
    assert [f for f, _ in way_out] == pytest.approx(first_out.tolist(), abs=1e-9)
    assert [e for _, e in way_out] == pytest.approx(final_out.tolist(), abs=1e-9)
    # a model whose request and finish overheads are far off changes nothing once both ways are replayed
    wrong = LatencyModel(
        MODEL.steps, ServingOverheads(request_s=0.05, finish_s=0.03, admission_delay_per_running_s=0.01), MODEL.jitter
    )
    run, delays = specs_of_run(run_specs, records), admission_delays(records, admissions)
    replayed = replay_run(SETUP, wrong, run, measured.step_seconds, delays, way_out)
    for r, m in zip(replayed.records, records, strict=True):  # each request as the client saw it
        assert r.ttft == pytest.approx(m.ttft, abs=1e-9) and r.e2el == pytest.approx(m.e2el, abs=1e-9)
    a, b = measured.summary(), replayed.summary()
    for metric in ("ttft_ms", "e2el_ms", "itl_ms"):
        for p in ("p50", "p95", "p99"):
            assert b[metric][p] == pytest.approx(a[metric][p], rel=1e-9)
    # without the ways out (a trace written before they were recorded) the replay is today's: tokens seen at
    # their step's end, the model's finish overhead
    old = replay_run(SETUP, wrong, run, measured.step_seconds, delays, way_out_delays(records, []))
    today = replay_run(SETUP, wrong, run, measured.step_seconds, delays)
    assert old.summary()["ttft_ms"] == today.summary()["ttft_ms"]
    assert old.summary()["e2el_ms"] == today.summary()["e2el_ms"]
    assert old.summary()["ttft_ms"]["p50"] < 0.9 * a["ttft_ms"]["p50"]


def test_way_out_delays_leave_requests_without_a_handoff_or_a_token_to_the_model() -> None:
    records = [
        RequestRecord(scheduled=1.0, token_times=[1.5, 1.6], end=1.7, request_id="a"),
        RequestRecord(scheduled=2.0, token_times=[2.5], end=2.6),
        RequestRecord(scheduled=3.0, end=3.5, request_id="c", error="overloaded"),
        RequestRecord(scheduled=4.0, token_times=[4.5], end=4.9, request_id="d"),
    ]
    handoffs = [
        {"request": "a", "first_token": 1.25},
        {"request": "a", "finished": 1.6},
        {"request": "c", "finished": 3.4},
        {"request": "d", "first_token": 4.4},
    ]
    out = way_out_delays(records, handoffs)
    assert out[0] == pytest.approx((0.25, 0.1)) and out[1] == (None, None)
    assert out[2][0] is None and out[2][1] == pytest.approx(0.1)
    assert out[3][0] == pytest.approx(0.1) and out[3][1] is None


def test_a_replay_shorter_than_the_run_predicts_the_remaining_steps() -> None:
    full = simulate(SETUP, MODEL, specs(n=20), jitter=False)
    half = replay_run(SETUP, MODEL, specs(n=20), full.step_seconds[: full.steps // 2])
    assert half.summary()["e2el_ms"]["p50"] == pytest.approx(full.summary()["e2el_ms"]["p50"])


def test_traced_steps_are_cut_to_the_run_and_back_to_back_gaps_count() -> None:
    trace = [
        {"began": 0.5, "ended": 0.6, "chunks": [[8, 0]], "arrivals": 1},  # before the run
        {"began": 1.0, "ended": 1.010, "chunks": [[8, 0]], "arrivals": 1},
        {"began": 1.0105, "ended": 1.020, "chunks": [[1, 8]], "arrivals": 0},  # 0.5 ms later: back to back
        {"began": 1.5, "ended": 1.505, "chunks": [[1, 9]], "arrivals": 0},  # after an idle wait
        {"began": 9.0, "ended": 9.1, "chunks": [[8, 0]], "arrivals": 1},  # after the run
    ]
    steps = steps_in(trace, 1.0, 2.0)
    assert [s["began"] for s in steps] == [1.0, 1.0105, 1.5]
    assert replay_durations(steps) == pytest.approx([0.0105, 0.0095, 0.005])


def test_specs_of_a_run_take_the_clients_scheduled_times() -> None:
    records = [RequestRecord(scheduled=100.0), RequestRecord(scheduled=100.25)]
    out = specs_of_run([RequestSpec(8, 2, 0.0), RequestSpec(9, 3, 0.3)], records)
    assert [(s.prompt_tokens, s.output_tokens, s.arrival_s) for s in out] == [(8, 2, 0.0), (9, 3, 0.25)]


def test_step_cost_error_per_kind_of_step() -> None:
    exact = ServingStep(((16, 0),), MODEL.step_time([(16, 0)]), 0)
    slow_decode = ServingStep(((1, 16), (1, 20)), 1.5 * MODEL.step_time([(1, 16), (1, 20)]), 0)
    mixed = ServingStep(((16, 0), (1, 16)), 0.8 * MODEL.step_time([(16, 0), (1, 16)]), 0)
    assert [step_kind(s.chunks) for s in (exact, slow_decode, mixed)] == ["prefill", "decode", "mixed"]
    errors = step_cost_errors(MODEL, [exact, slow_decode, mixed])
    assert errors["prefill"]["median_rel_error"] == pytest.approx(0.0, abs=1e-12)
    assert errors["decode"]["median_rel_error"] == pytest.approx(1 / 3)  # predicted 1 where 1.5 was measured
    assert errors["decode"]["mean_signed_error"] < 0
    assert errors["mixed"]["mean_signed_error"] == pytest.approx(0.25)
    assert errors["all"]["steps"] == 3


def test_prediction_interval_covers_a_noisy_servers_percentiles_at_its_level() -> None:
    # the noisy server: the same engine with the profile's jitter, on seeds the interval never simulated
    interval = prediction_interval(SETUP, MODEL, specs(n=80), level=0.9, seeds=40, first_seed=0)
    points = [("e2el_ms", "p50"), ("e2el_ms", "p99"), ("ttft_ms", "p50"), ("ttft_ms", "p99")]
    inside = {k: 0 for k in points}
    runs = 40
    for seed in range(1000, 1000 + runs):
        summary = simulate(SETUP, MODEL, specs(n=80), seed=seed).summary()
        for metric, p in points:
            inside[(metric, p)] += interval.contains(metric, p, summary[metric][p])
    for key, count in inside.items():
        assert count / runs >= 0.8, (key, count)  # 90% stated; 40 runs leave a few either side
    assert 0 < interval.relative_width("e2el_ms", "p99") < 1.0
    # without jitter the interval collapses and the noisy runs fall outside it
    still = prediction_interval(SETUP, LatencyModel(MODEL.steps, MODEL.overheads), specs(n=80), seeds=5)
    assert still.relative_width("e2el_ms", "p50") == 0.0
    noisy = simulate(SETUP, MODEL, specs(n=80), seed=1234).summary()["e2el_ms"]["p50"]
    assert not still.contains("e2el_ms", "p50", noisy)


def test_an_interval_level_outside_zero_and_one_is_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        prediction_interval(SETUP, MODEL, specs(n=5), level=1.5)
