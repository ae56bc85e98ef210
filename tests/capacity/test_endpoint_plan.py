"""Planning for an engine endpoint: its two limits, the rate one replica carries, replicas for a peak."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from capacity_helpers import STEP_MODEL

from servegate.capacity.latency.prediction import sim_setup
from servegate.capacity.latency.terms import StepJitter
from servegate.capacity.memory.plan import manifest_memory
from servegate.capacity.planning.planner import plan
from servegate.capacity.planning.rate_limit import latency_ratios, max_rate
from servegate.capacity.planning.replicas import load_arrival_trace, peak_rate, replicas_for
from servegate.capacity.planning.report import plan_json, plan_lines
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel

WORKLOAD = {"input_tokens": {"mean": 32, "max": 32}, "output_tokens": {"mean": 8, "max": 8}, "num_requests": 80}
NOISY = replace(STEP_MODEL, jitter=StepJitter(spread=0.3))


def endpoint(model_dir: Path, targets: dict[str, Any], rate: float = 20.0, **capacity: Any) -> ServedModel:
    return ServedModel.model_validate(
        {
            "name": "remote",
            "weights": {"source": str(model_dir)},
            "runtime": {"backend": "endpoint", "endpoint_url": "http://10.0.0.5:8000/v1", "max_model_len": 128},
            "preprocess": {"max_input_tokens": 64},
            "postprocess": {"max_output_tokens": 32},
            "batching": {"mode": "continuous", "max_batch_size": 4, "max_num_batched_tokens": 256},
            "capacity": {"workload": {**WORKLOAD, "rate_rps": rate}, "targets": targets, **capacity},
        }
    )


def run(served: ServedModel, total: tuple[float, str] | None = None, requests: int = 80) -> Any:
    assert served.capacity.workload is not None
    memory = manifest_memory(served)
    result = plan(served, served.capacity.workload, STEP_MODEL, memory, num_requests=requests, total=total)
    return result, plan_json(result, STEP_MODEL, {}, served.fingerprint)


def test_an_endpoint_plan_searches_the_engines_two_limits_and_ranks_by_rate(model_dir: Path) -> None:
    result, data = run(endpoint(model_dir, {"e2e_ms": {"p99": 400}}), requests=40)
    tried = [c["batching"] for c in data["candidates"]]
    assert {b["mode"] for b in tried} == {"continuous"}
    assert {b["max_batch_size"] for b in tried} == {1, 2, 4, 8, 16}  # up to 4x the declared 4
    # 64 (max_input_tokens) is below max_model_len 128: vLLM refuses to start so without chunked prefill
    assert {b["max_num_batched_tokens"] for b in tried} == {128, 256, 512}
    assert data["candidates"][0]["verdict"] == "recommended"
    first = data["candidates"][0]["batching"]
    assert all(data["recommended"]["batching"][k] == v for k, v in first.items())
    rates = [c["max_rate_under_targets_rps"] for c in data["candidates"] if c["feasible"]]
    assert len(rates) > 1 and rates[0] == max(rates)  # the recommended carries the most under the targets
    assert 0 < data["per_replica"]["rate_rps"] <= data["per_replica"]["capacity_rps"] * 1.2
    losers = [c["verdict"] for c in data["candidates"][1:]]
    assert all(v.startswith(("misses", "carries", "sustains", "feasible")) for v in losers)
    assert any(n.startswith("the endpoint engine's scheduler is modelled as continuous batching") for n in result.notes)


def test_the_rate_limit_is_the_largest_rate_where_the_targets_hold(model_dir: Path) -> None:
    served = endpoint(model_dir, {"e2e_ms": {"p99": 150}})
    assert served.capacity.workload is not None
    setup = sim_setup(served)
    limit = max_rate(setup, STEP_MODEL, served.capacity.workload, served.capacity.targets, num_requests=80, seeds=1)
    assert 0 < limit.rate_rps < limit.capacity_rps
    assert limit.binding == "latency" and limit.binding_target == "e2e_ms.p99"
    from servegate.capacity.bench.workload import make_requests, with_rate
    from servegate.capacity.latency.simulate import simulate

    def worst(rate: float) -> float:
        specs = make_requests(with_rate(served.capacity.workload, rate), 0, num_requests=80)
        return max(latency_ratios(served.capacity.targets, simulate(setup, STEP_MODEL, specs).summary()).values())

    assert worst(limit.rate_rps) <= 1.0
    assert worst(limit.rate_rps + 1.2 * limit.capacity_rps / 2**7) > 1.0


def test_the_rate_limits_interval_brackets_the_central_rate_under_jitter(model_dir: Path) -> None:
    served = endpoint(model_dir, {"e2e_ms": {"p99": 150}})
    assert served.capacity.workload is not None
    limit = max_rate(sim_setup(served), NOISY, served.capacity.workload, served.capacity.targets, num_requests=80)
    assert limit.low_rps <= limit.rate_rps <= limit.high_rps
    assert limit.low_rps < limit.high_rps
    assert limit.level == pytest.approx(0.9)


def test_without_latency_targets_throughput_binds_at_capacity(model_dir: Path) -> None:
    served = endpoint(model_dir, {})
    assert served.capacity.workload is not None
    limit = max_rate(sim_setup(served), STEP_MODEL, served.capacity.workload, None, num_requests=60)
    assert limit.binding == "throughput" and limit.rate_rps == limit.capacity_rps
    assert limit.low_rps <= limit.rate_rps < limit.high_rps  # never of zero width, even from a jitter-free model


def test_with_chunked_prefill_an_engine_may_take_a_token_budget_below_max_model_len(model_dir: Path) -> None:
    from servegate.capacity.planning.sizing import engine_policies

    served = endpoint(model_dir, {})
    chunked = served.with_changes(batching={**served.batching.model_dump(mode="json"), "chunked_prefill": True})
    assert min(p["max_num_batched_tokens"] for p in engine_policies(chunked)) == 64
    assert min(p["max_num_batched_tokens"] for p in engine_policies(served)) == 128


@pytest.mark.parametrize("targets", [{}, {"e2e_ms": {"p99": 100_000}}])
def test_a_capacity_bound_interval_is_never_of_zero_width_and_widens_with_the_measured_spread(
    model_dir: Path, targets: dict[str, Any]
) -> None:
    """#40: a plan claimed "287 requests/s (60% interval 287-287)" where the targets held at every rate. The
    limit is then the capacity, never above it, and its interval carries the profile's measured spread."""
    from servegate.capacity.latency.blackbox_fit import BlackBoxFit, KneeRate, KneeSweep
    from servegate.capacity.latency.provenance import FitQuality
    from servegate.capacity.planning.rate_limit import measured_spread

    served = endpoint(model_dir, targets)
    workload = served.capacity.workload
    assert workload is not None
    bare = max_rate(sim_setup(served), STEP_MODEL, workload, served.capacity.targets, num_requests=60)
    assert bare.rate_rps == pytest.approx(bare.capacity_rps) and bare.binding == "throughput"
    assert bare.high_rps > bare.low_rps and bare.measured_spread == 0.0

    def past_knee(pace: float) -> KneeRate:
        return KneeRate(40.0, 60, pace, 900.0, 800.0, 300.0, 250.0, False, pace, 40.0)

    knee = KneeSweep(30.0, 20.0, (past_knee(24.0), past_knee(28.0), past_knee(26.0)), 40.0)
    box = BlackBoxFit("http://h/v1", (), (), 0.02, 0.05, knee)
    measured = replace(STEP_MODEL, fit=FitQuality(black_box=box))
    spread, source = measured_spread(measured)
    assert spread == pytest.approx(2.0 / 26.0)  # the paces' own spread: the capacity was measured
    assert source == "3 runs past the knee"
    no_knee = replace(STEP_MODEL, fit=FitQuality(black_box=replace(box, knee=None)))
    assert measured_spread(no_knee) == (0.05, "the decode-step fit over 0 bursts")
    wide = max_rate(sim_setup(served), measured, workload, served.capacity.targets, num_requests=60)
    assert wide.rate_rps == pytest.approx(bare.rate_rps) and wide.measured_spread == pytest.approx(spread)
    # 90% of a normal error of `spread`: at least 1.64 x spread either side
    assert wide.low_rps <= wide.rate_rps * (1 - 1.64 * spread) and wide.high_rps >= wide.rate_rps * (1 + 1.64 * spread)
    assert wide.binding == "throughput"  # a measured capacity: its paces' spread alone, not the seeds' on top
    assert wide.low_rps == pytest.approx(wide.rate_rps * (1 - 1.6449 * spread), rel=1e-3)


def test_replicas_for_a_trace_with_a_peak(tmp_path: Path, model_dir: Path) -> None:
    # 120 s at 2 requests/s with a 10 s burst at 30 requests/s in the middle
    quiet = [i * 0.5 for i in range(240)]
    burst = [60 + i / 30 for i in range(300)]
    trace = tmp_path / "arrivals.txt"
    trace.write_text("\n".join(f"{t:.6f}" for t in sorted(quiet + burst)) + "\n")
    times = load_arrival_trace(trace)
    peak = peak_rate(times, window_s=10)
    assert peak == pytest.approx(32, abs=0.2)  # the burst plus the quiet arrivals under it
    assert peak_rate(times, window_s=120) < 7  # a long window averages the peak away
    result, data = run(endpoint(model_dir, {"e2e_ms": {"p99": 400}}), total=(peak, "the trace's peak"), requests=40)
    per = result.rate_limit.rate_rps
    assert result.replicas.replicas == math.ceil(peak / per)
    assert data["replicas"]["replicas"] == math.ceil(peak / per)
    assert any(line.startswith(f"replicas: {math.ceil(peak / per)} for") for line in plan_lines(data))


def test_replicas_for_a_declared_total_rate() -> None:
    assert replicas_for(12.0, 3.1, "capacity.total_rate_rps").replicas == 4
    assert replicas_for(6.2, 3.1, "x").replicas == 2  # exactly two replicas' worth
    with pytest.raises(ServegateError, match="no replica count"):
        replicas_for(12.0, 0.0, "x")


def test_an_arrival_trace_reads_json_lines_and_names_a_bad_line(tmp_path: Path) -> None:
    good = tmp_path / "a.jsonl"
    good.write_text('{"timestamp": 1.5}\n{"timestamp": 2.0}\n# comment\n3\n')
    assert load_arrival_trace(good) == [1.5, 2.0, 3.0]
    bad = tmp_path / "b.txt"
    bad.write_text("1\nsoon\n")
    with pytest.raises(ServegateError, match=r"b.txt:2: expected an arrival time"):
        load_arrival_trace(bad)


def test_an_infeasible_target_is_explained_per_replica(model_dir: Path) -> None:
    # served alone a request takes 52.2 ms (capacity_helpers.STEP_MODEL): a 20 ms target is out of reach
    result, data = run(endpoint(model_dir, {"e2e_ms": {"p99": 20}}), total=(12.0, "--total-rate"))
    assert not result.feasible
    assert any("no batching policy can meet it" in w for w in data["why"])
    assert data["per_replica"]["rate_rps"] == 0.0
    assert "no rate meets it on this replica" in data["per_replica"]["detail"]
    assert data["replicas"] is None  # no count of replicas reaches a target one replica cannot meet
    assert all(not c["feasible"] and c["verdict"].startswith("misses e2e_ms.p99") for c in data["candidates"][1:])
