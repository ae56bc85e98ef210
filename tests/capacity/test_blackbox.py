"""The black-box profile of an endpoint: known step costs of a fake continuous-batching engine, recovered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from capacity_helpers import write_model_dir
from support.step_cost_server import StepCosts, StepCostServer

from servegate.capacity.latency.blackbox import (
    BRACKET_RATIO,
    ItlPoint,
    TtftPoint,
    blackbox_grid,
    engine_setup,
    fit_blackbox,
    knee_sweep,
    profile_endpoint,
)
from servegate.capacity.latency.blackbox_fit import KneeRate, KneeSweep
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.run_pace import kept_up_with, paces
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel

# 8 ms per step + 0.3 ms per prompt token + 2 ms per decoding sequence
COSTS = StepCosts(step_s=0.008, prefill_token_s=0.0003, decode_seq_s=0.002, max_batch_size=8,
                  max_num_batched_tokens=512)  # fmt: skip


def endpoint_manifest(model_dir: Path, url: str, **capacity: object) -> ServedModel:
    return ServedModel.model_validate(
        {
            "name": "remote",
            "weights": {"source": str(model_dir)},  # a config.json only: prompts are 4 characters a token
            "runtime": {"backend": "endpoint", "endpoint_url": url, "max_model_len": 256},
            "preprocess": {"max_input_tokens": 192},
            "postprocess": {"max_output_tokens": 16},
            "batching": {"mode": "continuous", "max_batch_size": 8, "max_num_batched_tokens": 512},
            "capacity": capacity,
        }
    )


def test_the_grid_covers_prompt_lengths_bursts_and_two_contexts(tmp_path: Path) -> None:
    grid = blackbox_grid(endpoint_manifest(write_model_dir(tmp_path), "http://h/v1"))
    assert grid.prompt_lengths == (24, 48, 96, 144, 192)
    assert grid.batches == (1, 2, 4, 8)
    assert len(grid.contexts) == 2


def test_the_fit_recovers_exact_step_costs_from_exact_points() -> None:
    itl = [ItlPoint(b, ctx, 0.008 + 0.002 * b, (0.008 + 0.002 * b,)) for b in (1, 2, 4, 8) for ctx in (8, 50)]
    ttft = [TtftPoint(n, 0.003 + 0.008 + 0.00015 * n, 0.0005) for n in (12, 48, 96)]
    model = fit_blackbox(ttft, itl)
    assert model.steps.c_step == pytest.approx(0.008, rel=1e-6)
    assert model.steps.c_decode_seq == pytest.approx(0.002, rel=1e-6)
    assert model.steps.c_prefill_token == pytest.approx(0.00015, rel=1e-6)
    assert model.steps.c_decode_attn == model.steps.c_prefill_attn == 0.0  # no curvature in the points
    assert model.overheads.request_s == pytest.approx(0.003, rel=1e-6)
    assert model.overheads.finish_s == pytest.approx(0.0005)


def test_one_burst_size_cannot_separate_step_and_sequence_costs() -> None:
    itl = [ItlPoint(1, ctx, 0.01, (0.01,)) for ctx in (8, 50, 90)]
    with pytest.raises(ServegateError, match="two sizes"):
        fit_blackbox([TtftPoint(8, 0.01, 0.0), TtftPoint(16, 0.02, 0.0)], itl)


def test_black_box_profile_recovers_a_fake_endpoints_step_costs(tmp_path: Path) -> None:
    with StepCostServer(COSTS) as server:
        served = endpoint_manifest(write_model_dir(tmp_path), server.url)  # no workload: no knee sweep
        model = profile_endpoint(served, repeats=2)
    c = model.steps
    assert c.c_step == pytest.approx(COSTS.step_s, rel=0.05)
    assert c.c_decode_seq == pytest.approx(COSTS.decode_seq_s, rel=0.05)
    assert c.c_prefill_token == pytest.approx(COSTS.prefill_token_s, rel=0.05)
    # what the planner uses: decode steps of every batch and the prefill of every prompt, within 5%
    for batch in (1, 4, 8):
        assert model.decode_time(batch, 40) == pytest.approx(COSTS.step_s + batch * COSTS.decode_seq_s, rel=0.05)
    assert model.prefill_time(192) == pytest.approx(COSTS.step_seconds([(192, 0)]), rel=0.05)
    assert model.fit.black_box is not None and model.fit.black_box.endpoint == server.url
    assert model.fit.black_box.knee is None
    again = LatencyModel.from_dict(model.as_dict())  # the profile round-trips through its JSON
    assert again.fit.black_box == model.fit.black_box and again.steps == model.steps


WORKLOAD = {"input_tokens": {"mean": 32, "max": 32}, "output_tokens": {"mean": 12, "max": 12},
            "rate_rps": 10, "num_requests": 40}  # fmt: skip


def _sweep(tmp_path: Path, speed_up: float) -> KneeSweep:
    """The knee search against the fake engine, from a model whose steps are `speed_up` times too fast."""
    from servegate.capacity.bench.own_server import against_server
    from servegate.capacity.bench.targets import PromptFactory
    from servegate.capacity.latency.terms import StepCost

    truth = StepCost(c_step=COSTS.step_s, c_prefill_token=COSTS.prefill_token_s, c_decode_seq=COSTS.decode_seq_s)
    wrong = LatencyModel(StepCost(**{k: v / speed_up for k, v in truth.as_dict().items()}))
    with StepCostServer(COSTS) as server:
        served = endpoint_manifest(write_model_dir(tmp_path), server.url, workload=WORKLOAD)
        workload = served.capacity.workload
        assert workload is not None

        def action(target: Any) -> Any:
            return knee_sweep(target, PromptFactory(None), engine_setup(served), wrong, workload, seconds=1.0)

        sweep: KneeSweep = against_server(server.url, served, action)
    return sweep


@pytest.mark.slow
@pytest.mark.parametrize("speed_up", [4.0, 0.3])
def test_the_knee_search_brackets_the_engines_knee_from_a_wrong_prediction(tmp_path: Path, speed_up: float) -> None:
    """A model 4x too fast sends the search down, one 3x too slow sends it up: either way it ends with a rate kept
    up with and one missed within BRACKET_RATIO, the lowest missed run twice (the capacity measured twice)."""
    sweep = _sweep(tmp_path, speed_up)
    assert sweep.bracketed and sweep.measured_knee_rps is not None and sweep.missed_rps is not None
    assert sweep.missed_rps / sweep.measured_knee_rps <= BRACKET_RATIO * 1.001
    assert [r.rate_rps for r in sweep.rates].count(sweep.missed_rps) == 2
    assert len(sweep.saturated_rps()) >= 2 and sweep.capacity_spread() > 0
    first = sweep.rates[0].rate_rps
    assert (first > sweep.missed_rps) if speed_up > 1 else (first < sweep.measured_knee_rps)
    # the predicted capacity is off by the factor: the first rate run, past the knee or below it, and said so
    assert not sweep.extrapolated(sweep.predicted_capacity_rps)
    edge = sweep.missed_rps if speed_up > 1 else sweep.measured_knee_rps
    where = f"past the measured knee (fell behind at {edge:.3g})" if speed_up > 1 else (
        f"below the measured knee (kept up with at {edge:.3g})")  # fmt: skip
    assert sweep.lines()[0].endswith(f"predicted capacity {sweep.predicted_capacity_rps:.3g} requests/s, {where}")


@pytest.mark.slow
def test_a_model_too_fast_is_fitted_to_the_measured_pace_past_the_knee(tmp_path: Path) -> None:
    """The step fit 4x too fast: the machine's time per request is fitted until the simulated capacity is the
    measured pace past the knee."""
    from servegate.capacity.latency.blackbox import fit_to_knee
    from servegate.capacity.latency.prediction import saturation_throughput
    from servegate.capacity.latency.terms import StepCost

    sweep = _sweep(tmp_path, 4.0)
    truth = StepCost(c_step=COSTS.step_s, c_prefill_token=COSTS.prefill_token_s, c_decode_seq=COSTS.decode_seq_s)
    wrong = LatencyModel(StepCost(**{k: v / 4.0 for k, v in truth.as_dict().items()}))
    (tmp_path / "again").mkdir()
    served = endpoint_manifest(write_model_dir(tmp_path / "again"), "http://h/v1", workload=WORKLOAD)
    assert served.capacity.workload is not None
    setup = engine_setup(served)
    fitted, knee = fit_to_knee(wrong, sweep, setup, served.capacity.workload)
    assert knee.measured_capacity_rps is not None and knee.arrival_s == 0
    assert 0 < knee.serving_work_s < 1.0 / knee.measured_capacity_rps
    assert fitted.overheads.capacity_rps == knee.measured_capacity_rps
    assert saturation_throughput(setup, fitted, served.capacity.workload) == pytest.approx(
        knee.measured_capacity_rps, rel=0.05)  # fmt: skip
    assert fitted.steps == wrong.steps  # lone requests and bursts keep what the step fit read
    assert "ms of the machine, which the requests served share" in knee.lines()[1]


def test_a_sweep_without_a_bracket_says_the_knee_is_an_extrapolation() -> None:
    def rate(r: float, kept: bool) -> KneeRate:
        return KneeRate(r, 20, r, 10.0, 10.0, 5.0, 5.0, kept, r if kept else 0.8 * r, r)

    none = KneeSweep(198.0, None, tuple(rate(r, False) for r in (198.0, 99.0, 49.5)), 49.5)
    assert not none.bracketed and none.extrapolated(198.0) and none.measured_range == (49.5, 198.0)
    assert none.lines() == [
        "knee: not measured - the sweep kept up with none of its rates from 49.5 to 198 requests/s; the predicted "
        "capacity 198 requests/s is an extrapolation"
    ]
    inside = KneeSweep(10.0, 9.0, (rate(9.0, True), rate(11.0, False), rate(11.0, False)), 11.0)
    assert inside.bracketed and not inside.extrapolated(10.0) and inside.extrapolated(12.0)
    assert inside.lines()[0].endswith("predicted capacity 10 requests/s, within the measured bracket")
    assert inside.position(9.5) == "within the measured bracket" and inside.capacity_spread() == 0.0
    assert inside.position(12.0) == "an extrapolation beyond what was measured"


def test_the_capacity_is_read_only_off_runs_near_the_knee() -> None:
    """A run far past the knee forms batches no load near it does: its pace is not the capacity's."""

    def missed(r: float, pace: float) -> KneeRate:
        return KneeRate(r, 20, pace, 900.0, 800.0, 300.0, 250.0, False, pace, r)

    rates = (missed(428.0, 98.9), missed(214.0, 42.7), missed(107.0, 44.1), missed(53.5, 40.8), missed(53.5, 38.5))
    knee = KneeSweep(428.0, 45.0, rates, 53.5)
    assert knee.saturated_rps() == [44.1, 40.8, 38.5]  # within 2.5 x 53.5 requests/s
    assert knee.capacity_spread() == pytest.approx(0.068, abs=0.001)


def test_a_run_short_against_its_latency_still_counts_as_kept_up() -> None:
    """20 requests sent over 1 s, each answered 2 s later: completions over the whole run are 20 / 3 s, but the
    answers come as fast as the sends (the pace compared), so the engine kept up."""
    from servegate.capacity.bench.run_metrics import RequestRecord

    kept = [RequestRecord(i / 19, i / 19, [i / 19 + 1.0], i / 19 + 2.0) for i in range(20)]
    behind = [RequestRecord(i / 19, i / 19, [i / 19 + 1.0], 2.0 + i / 5) for i in range(20)]
    assert kept_up_with(kept) and not kept_up_with(behind)


def test_answers_in_bursts_from_a_growing_queue_are_not_taken_for_keeping_up() -> None:
    """60 requests sent over 3 s (20/s), answered in two batches of 30, at 2 s and 5 s: the queue grows, however
    the answers bunch (half of their pairs are 0 s apart, which a rank-slope pace reads as no time at all)."""
    from servegate.capacity.bench.run_metrics import RequestRecord

    bursts = [RequestRecord(i / 20, i / 20, [2.0 + 3.0 * (i // 30)], 2.0 + 3.0 * (i // 30)) for i in range(60)]
    done, sent = paces(bursts)
    assert sent == pytest.approx(20.0) and done is not None and done < 0.9 * sent
    assert not kept_up_with(bursts)
    steady = [RequestRecord(i / 20, i / 20, [i / 20 + 0.1], i / 20 + 0.1 + 0.3 * (i % 2)) for i in range(60)]
    assert kept_up_with(steady)  # uneven latencies that do not grow


def test_the_knee_search_starts_no_faster_than_the_lone_serving_overhead_allows() -> None:
    from dataclasses import replace

    from servegate.capacity.latency.blackbox import sweep_start
    from servegate.capacity.latency.terms import ServingOverheads, StepCost

    fast_steps = LatencyModel(StepCost(c_step=1e-4))
    assert sweep_start(fast_steps, 1009.8) == 1009.8  # no overhead measured: the prediction
    served = replace(fast_steps, overheads=ServingOverheads(request_s=0.0119))
    assert sweep_start(served, 1009.8) == pytest.approx(84.0, abs=0.1)  # vLLM's API server, 11.9 ms a request
    assert sweep_start(served, 30.0) == 30.0  # a slower engine: its own prediction
