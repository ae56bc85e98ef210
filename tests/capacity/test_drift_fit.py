"""What a black-box profile fits on its steady stream: the machine's drift, a slowdown that lasts in time, drawn on
the simulator's clock (latency/drift_fit.py, StepJitter.drift_spread), and the load stretch that sets the stream's
median (latency/stretch_fit.py, ServingOverheads.load_stretch_per_rps)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import pytest

from servegate.capacity.bench.workload import RequestSpec
from servegate.capacity.latency.blackbox_fit import BlackBoxFit, SteadyStream
from servegate.capacity.latency.drift_fit import (
    STREAM_LOAD,
    correlation_time,
    fit_drift,
    lag_correlations,
    stream_rate,
)
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.simulate import SimSetup, _StepNoise, simulate
from servegate.capacity.latency.stream_fit import fit_stream
from servegate.capacity.latency.stretch_fit import STRETCH_BISECTIONS, fit_load_stretch
from servegate.capacity.latency.terms import ServingOverheads, StepCost, StepJitter
from servegate.contracts.capacity_section import Workload

# 4 ms a step + 2 ms a decoding sequence + 0.1 ms a prompt token; 2 ms in and 1 ms out; a little step noise
MODEL = LatencyModel(
    StepCost(c_step=0.004, c_prefill_token=0.0001, c_decode_seq=0.002),
    ServingOverheads(request_s=0.002, finish_s=0.001),
    StepJitter(spread=0.2),
)
SETUP = SimSetup("continuous", 8, 0.0, 512, False, num_blocks=256, block_size=16)


def drifting(spread: float, seconds: float) -> LatencyModel:
    return replace(MODEL, jitter=replace(MODEL.jitter, drift_spread=spread, drift_seconds=seconds))


def stream(rate: float, seconds: float, seed: int = 5) -> list[RequestSpec]:
    """Poisson arrivals at `rate` for `seconds`: 32 prompt tokens, 8 output tokens each."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, size=int(rate * seconds)))
    return [RequestSpec(32, 8, float(t)) for t in times]


def recording(read: Callable[[LatencyModel], Any]) -> tuple[list[Any], Callable[[LatencyModel], LatencyModel]]:
    """A refit that changes nothing and notes `read` of every model it is given."""
    tried: list[Any] = []

    def refit(model: LatencyModel) -> LatencyModel:
        tried.append(read(model))
        return model

    return tried, refit


def test_the_drift_is_an_ornstein_uhlenbeck_process_of_median_one_on_the_virtual_clock() -> None:
    noise = _StepNoise(drifting(0.5, 1.0), seed=3, jitter=True, drift=True)
    times = np.arange(0.0, 4000.0, 0.25)
    logs = np.log([noise.drift(t) for t in times])
    assert np.median(logs) == pytest.approx(0.0, abs=0.05)  # the speed bursts measure, half the time
    assert np.std(logs) == pytest.approx(0.5, rel=0.05)
    lag = round(1.0 / 0.25)  # one correlation time apart: exp(-1)
    assert np.corrcoef(logs[:-lag], logs[lag:])[0, 1] == pytest.approx(math.exp(-1), abs=0.05)
    assert noise.drift(10.0) == noise.drift(5.0)  # it moves forward only: an earlier moment reads the last one
    # without drawing its moments every moment runs at its mean, the capacity's view of it
    plain = _StepNoise(drifting(0.5, 1.0), seed=3, jitter=True, drift=False)
    assert plain.drift(7.0) == pytest.approx(math.exp(0.5**2 / 2))
    assert _StepNoise(MODEL, seed=3, jitter=True, drift=True).drift(7.0) == 1.0  # no drift fitted: no effect


def test_a_lasting_drift_lengthens_a_streams_tail_and_leaves_a_lone_request_alone() -> None:
    specs = stream(20.0, 20.0)
    plain = simulate(SETUP, MODEL, specs, seed=1).summary()
    slow = simulate(SETUP, drifting(0.8, 1.0), specs, seed=1).summary()
    assert slow["e2el_ms"]["p99"] > 1.5 * plain["e2el_ms"]["p99"]
    # the same spread with no memory (a hundredth of a request's life) mostly averages out within each request
    brief = simulate(SETUP, drifting(0.8, 0.0005), specs, seed=1).summary()
    assert brief["e2el_ms"]["p99"] < slow["e2el_ms"]["p99"]
    [alone] = simulate(SETUP, drifting(0.8, 1.0), [RequestSpec(32, 8, 0.0)], jitter=False).records
    [base] = simulate(SETUP, MODEL, [RequestSpec(32, 8, 0.0)], jitter=False).records
    assert alone.e2el == pytest.approx(base.e2el * math.exp(0.8**2 / 2))  # undrawn: the drift's mean


def test_the_correlation_time_is_read_off_residuals_correlated_in_time() -> None:
    rng = np.random.default_rng(0)
    sent = np.sort(rng.uniform(0, 30, 600))
    noise = _StepNoise(drifting(1.0, 0.8), seed=4, jitter=True, drift=True)
    lasting = np.log([noise.drift(t) for t in sent])
    residuals = lasting + rng.normal(0, 0.3, sent.size)  # each request's own noise on top
    correlations = lag_correlations(sent, residuals)
    assert [(lo, hi) for lo, hi, _ in correlations] == [(0.1, 0.25), (0.25, 0.5), (0.5, 1.0), (1.0, 2.0), (2.0, 4.0)]
    assert correlations[0][2] > correlations[-1][2]
    assert 0.4 < correlation_time(correlations) < 1.6
    # independent residuals: nothing lasts
    assert correlation_time(lag_correlations(sent, rng.normal(0, 1, sent.size))) < 0.15


def _records(specs: list[RequestSpec], model: LatencyModel, seed: int) -> list:
    """A 'measured' stream: the specs simulated under `model` (one draw of its noise)."""
    return simulate(SETUP, model, specs, seed=seed).records


def test_the_fit_finds_a_drift_that_is_there_and_none_where_there_is_none() -> None:
    specs = stream(20.0, 20.0)
    truth = drifting(0.8, 1.0)
    fitted, record = fit_drift(SETUP, MODEL, specs, _records(specs, truth, seed=11), 20.0)
    assert record is not None and record.requests == len(specs)
    assert 0.4 <= fitted.jitter.drift_spread <= 1.2, record
    assert 0.3 <= fitted.jitter.drift_seconds <= 3.0, record
    assert record.fitted_tail_ms == pytest.approx(record.measured_tail_ms, rel=0.25)
    assert record.measured_tail_ms > record.simulated_tail_ms
    assert fitted.steps == MODEL.steps  # the drift is all it adds (no refit given)
    _, quiet = fit_drift(SETUP, MODEL, specs, _records(specs, MODEL, seed=11), 20.0)
    assert quiet is not None and quiet.drift_spread <= 0.2, quiet
    assert "no drift fitted" in quiet.lines()[-1] or quiet.drift_spread > 0


def test_the_refit_runs_under_each_spread_tried() -> None:
    specs = stream(20.0, 10.0)
    tried, refit = recording(lambda m: m.jitter.drift_spread)

    fit_drift(SETUP, MODEL, specs, _records(specs, drifting(0.8, 1.0), seed=2), 20.0, refit=refit)
    assert tried and tried == sorted(tried) and tried[0] > 0


def test_a_stream_that_failed_fits_nothing() -> None:
    specs = stream(20.0, 2.0)
    records = _records(specs, MODEL, seed=0)
    for r in records:
        r.error = "HTTP 500"
    assert fit_drift(SETUP, MODEL, specs, records, 20.0) == (MODEL, None)


def test_the_stream_runs_at_the_declared_rate_below_the_knee() -> None:
    shape = {"input_tokens": {"mean": 32, "max": 32}, "output_tokens": {"mean": 8, "max": 8}}
    assert stream_rate(Workload.model_validate({**shape, "rate_rps": 10}), 40.0) == 10.0
    assert stream_rate(Workload.model_validate({**shape, "rate_rps": 35}), 40.0) == pytest.approx(STREAM_LOAD * 40)
    closed = Workload.model_validate({**shape, "arrival": "closed", "concurrency": 4})
    assert stream_rate(closed, 40.0) == pytest.approx(STREAM_LOAD * 40)


def test_the_stream_is_kept_in_the_profile_and_said_in_words() -> None:
    record = SteadyStream(24.0, 288, 120.0, 90.0, 700.0, 500.0, 300.0, 480.0, ((0.1, 0.25, 0.6),), 0.9, 0.5)
    box = BlackBoxFit("http://h/v1", (), (), 0.1, 0.1, stream=record)
    assert BlackBoxFit.from_dict(asdict(box)) == box
    assert BlackBoxFit.from_dict({**asdict(box), "stream": None}).stream is None  # a profile made before it
    first, second = record.lines()
    assert first.startswith("steady stream: 288 requests at 24 requests/s, E2E mean 120.0 ms (p50 90.0, p95 500.0")
    assert "lasts 0.5 s (correlation time); p95 simulated with it 480.0 ms" in second
    loaded = replace(record, simulated_p50_ms=60.0, fitted_p50_ms=89.0, load_stretch_per_rps=0.05)
    assert BlackBoxFit.from_dict(asdict(replace(box, stream=loaded))).stream == loaded
    assert loaded.lines()[1] == (
        "  load: requests 120% slower at this rate (5.00% per request/s served), on top of the serving work; p50 "
        "simulated 60.0 ms without it, 89.0 with it"
    )


def slowed(factor: float, rate: float) -> LatencyModel:
    """MODEL with every part of a request `factor` times slower at `rate` requests/s served."""
    return replace(MODEL, overheads=replace(MODEL.overheads, load_stretch_per_rps=(factor - 1) / rate))


def test_the_load_stretch_is_fitted_to_the_streams_median() -> None:
    specs = stream(40.0, 15.0)
    measured = _records(specs, slowed(2.0, 40.0), seed=3)  # twice as slow at the stream's rate
    fitted, kept = fit_load_stretch(SETUP, MODEL, specs, measured, 40.0)
    median = 1000 * float(np.median([r.e2el for r in measured if r.ok]))
    assert kept is not None and kept.simulated_p50_ms < 0.8 * median
    assert kept.fitted_p50_ms == pytest.approx(median, rel=0.05)
    factor = 1 + fitted.overheads.load_stretch_per_rps * 40.0
    assert 1.6 <= factor <= 2.4, kept
    assert kept.load_stretch_per_rps == fitted.overheads.load_stretch_per_rps
    assert fitted.steps == MODEL.steps and fitted.jitter == MODEL.jitter  # the stretch is all it adds
    record = replace(SteadyStream(40.0, len(specs), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, (), 0.0, 0.0), **asdict(kept))
    assert f"requests {100 * (factor - 1):.0f}% slower at this rate" in record.lines()[1]


def test_a_model_as_slow_as_the_stream_fits_no_load_stretch() -> None:
    specs = stream(40.0, 10.0)
    tried, refit = recording(lambda m: m.overheads.load_stretch_per_rps)

    fast = replace(MODEL, steps=MODEL.steps.scaled(0.5))
    fitted, kept = fit_load_stretch(SETUP, MODEL, specs, _records(specs, fast, seed=3), 40.0, refit=refit)
    assert kept is not None and fitted is MODEL and kept.load_stretch_per_rps == 0.0 and not tried
    assert kept.fitted_p50_ms == kept.simulated_p50_ms
    failed = _records(specs, MODEL, seed=3)
    for r in failed:
        r.error = "HTTP 500"
    assert fit_load_stretch(SETUP, MODEL, specs, failed, 40.0) == (MODEL, None)


def test_the_serving_work_is_refitted_at_each_load_stretch_tried() -> None:
    specs = stream(40.0, 10.0)
    tried, refit = recording(lambda m: m.overheads.load_stretch_per_rps)

    measured = _records(specs, slowed(2.0, 40.0), seed=2)
    fit_load_stretch(SETUP, MODEL, specs, measured, 40.0, refit)
    # the top of the range, each halving, and the value kept
    assert len(tried) == STRETCH_BISECTIONS + 2 and all(t > 0 for t in tried)
    # fitted again, as after the drift: from 0, not from the value it has
    tried.clear()
    again, kept = fit_load_stretch(SETUP, slowed(3.0, 40.0), specs, measured, 40.0, refit)
    assert tried[0] == 0.0 and len(tried) == STRETCH_BISECTIONS + 3
    assert 1.6 <= 1 + 40.0 * again.overheads.load_stretch_per_rps <= 2.4, kept


def test_the_stream_fits_the_middle_then_the_tail_then_the_middle_again() -> None:
    specs = stream(20.0, 20.0)
    truth = replace(drifting(0.8, 1.0), overheads=replace(MODEL.overheads, load_stretch_per_rps=0.05))
    seen, refit = recording(lambda m: (m.jitter.drift_spread, m.overheads.load_stretch_per_rps))
    fitted, record = fit_stream(SETUP, MODEL, specs, _records(specs, truth, seed=11), 20.0, refit)
    assert record is not None and record.drift_spread > 0, record
    assert record.load_stretch_per_rps == fitted.overheads.load_stretch_per_rps > 0
    assert record.simulated_p50_ms is not None and record.simulated_p50_ms < record.measured_p50_ms
    drifted = next(i for i, (spread, _) in enumerate(seen) if spread > 0)
    assert drifted > 0 and all(spread == 0 for spread, _ in seen[:drifted])  # the middle first, without drift
    assert seen[-1][0] == record.drift_spread  # the middle again, under the drift fitted
    assert (record.drift_spread, 0.0) in seen[drifted:]  # ... fitted from 0
