"""The black-box profile of an endpoint: known step costs of a fake continuous-batching engine, recovered."""

from __future__ import annotations

from pathlib import Path

import pytest
from capacity_helpers import write_model_dir
from support.step_cost_server import StepCosts, StepCostServer

from servegate.capacity.latency.blackbox import (
    ItlPoint,
    TtftPoint,
    blackbox_grid,
    engine_setup,
    fit_blackbox,
    profile_endpoint,
)
from servegate.capacity.latency.model import LatencyModel
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


@pytest.mark.slow
def test_the_knee_sweep_brackets_the_predicted_capacity(tmp_path: Path) -> None:
    workload = {"input_tokens": {"mean": 32, "max": 32}, "output_tokens": {"mean": 12, "max": 12},
                "rate_rps": 10, "num_requests": 40}  # fmt: skip
    with StepCostServer(COSTS) as server:
        served = endpoint_manifest(write_model_dir(tmp_path), server.url, workload=workload)
        model = profile_endpoint(served, repeats=2, sweep_seconds=1.0)
    assert model.fit.black_box is not None
    knee = model.fit.black_box.knee
    assert knee is not None
    expected = [f * knee.predicted_capacity_rps for f in (0.5, 0.8, 1.0, 1.2)]
    assert [r.rate_rps for r in knee.rates] == pytest.approx(expected)
    assert knee.rates[0].kept_up  # half the predicted capacity is carried
    assert knee.measured_knee_rps is not None and knee.measured_knee_rps >= expected[0]
    assert engine_setup(served).mode == "continuous"
