"""Fitting the step-time model and keeping it keyed by manifest and machine."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from capacity_helpers import manifest

from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.latency.calibration import CalibrationRuns, calibrate
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.prediction import profile_key
from servegate.capacity.latency.provenance import Provenance, hardware_id, profile_path, profiles_dir
from servegate.capacity.latency.step_fit import fit_steps
from servegate.capacity.latency.step_timing import ProfileLimits, step_grid
from servegate.capacity.latency.terms import ServingOverheads, StepCost, StepSample

TRUE = StepCost(
    c_step=0.004, c_prefill_token=0.0002, c_prefill_chunk=0.0005, c_prefill_attn=1e-7, c_decode_seq=0.0008,
    c_decode_attn=2e-6,
)  # fmt: skip
RUNNER = StepCost(c_step=0.004, c_prefill_token=0.0001, c_decode_seq=0.0008)


def test_fit_recovers_known_coefficients_from_noisy_steps() -> None:
    rng = np.random.default_rng(0)
    truth = LatencyModel(TRUE)
    grid = step_grid(ProfileLimits(256, 32, 1024, 512), num_blocks=2048, block_size=16)
    samples = [StepSample(g, truth.step_time(g) * float(rng.normal(1, 0.02))) for g in grid for _ in range(3)]
    coefficients, quality = fit_steps(samples)
    fitted = LatencyModel(coefficients)
    assert quality.median_rel_error < 0.03 and quality.steps == len(samples)
    # what matters: predicted step times, across the grid and beyond it
    for chunks in ([(300, 0)], [(1, 700)] * 48, [(64, 0), *([(1, 100)] * 16)]):
        assert fitted.step_time(chunks) == pytest.approx(truth.step_time(chunks), rel=0.05)
    assert coefficients.c_step == pytest.approx(TRUE.c_step, rel=0.1)
    assert coefficients.c_decode_seq == pytest.approx(TRUE.c_decode_seq, rel=0.1)


def test_step_grid_fits_the_pool() -> None:
    grid = step_grid(ProfileLimits(64, 64, 256, 128), num_blocks=40, block_size=16)
    for chunks in grid:
        blocks = sum(-(-(n + s) // 16) for n, s in chunks)
        assert blocks <= 40
        assert sum(n for n, _ in chunks) <= 256 or len(chunks) == 1
    assert any(len(c) > 1 and all(n == 1 for n, _ in c) for c in grid)  # batched decodes are measured


def test_calibration_attributes_extra_gaps_to_serving_overheads() -> None:
    runner = LatencyModel(StepCost(c_step=0.004, c_prefill_token=0.0001, c_decode_seq=0.0005))

    def request(batch: int, start: float) -> RequestRecord:
        # the measured server adds 2 ms per step and 0.25 ms per sequence per step, 3 ms before the
        # first token and 1 ms after the last
        step = runner.decode_time(batch, 40) + 0.002 + 0.00025 * batch
        first = start + 0.003 + runner.prefill_time(32) + 0.002 + 0.00025
        times = [first + i * step for i in range(8)]
        return RequestRecord(start, start, times, times[-1] + 0.001, output_tokens=8, prompt_tokens=32)

    runs = CalibrationRuns([request(1, i) for i in range(3)], {8: [request(8, 10 + i) for i in range(8)]})
    model = calibrate(runner, runs)
    assert model is not runner and runner.overheads == ServingOverheads()  # a new model; the old one unchanged
    assert model.fit.calibration is not None and model.fit.calibration.requests == 11
    assert model.fit.calibration.step_overhead_s == pytest.approx(0.002, abs=2e-4)
    assert model.fit.calibration.per_sequence_overhead_s == pytest.approx(0.00025, abs=5e-5)
    assert model.steps.c_step == pytest.approx(0.004 + model.fit.calibration.step_overhead_s)
    assert model.overheads.request_s == pytest.approx(0.003, abs=3e-4)
    assert model.overheads.finish_s == pytest.approx(0.001, abs=1e-4)


def test_saved_model_round_trips_and_is_keyed_by_manifest_and_machine(tmp_path, monkeypatch, model_dir) -> None:
    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path / "home"))
    served = manifest(model_dir)
    provenance = Provenance(key=profile_key(served), hardware=hardware_id())
    model = LatencyModel(TRUE, ServingOverheads(request_s=0.01), provenance=provenance)
    path = model.save(profile_path(provenance.key, provenance.hardware))
    assert path.parent == profiles_dir() and path.parent.is_relative_to(tmp_path)
    loaded = LatencyModel.load(path)
    assert loaded == model
    # the batching policy is what the planner varies: it does not change the profile key ...
    other_policy = served.with_changes(batching={"mode": "none"})
    assert profile_key(other_policy) == profile_key(served)
    # ... but the compute dtype does
    changed = served.with_changes(runtime={**served.runtime.model_dump(), "dtype": "bfloat16"})
    assert profile_key(changed) != profile_key(served)


def test_serving_fit_recovers_step_costs_the_admission_and_answer_costs_and_keeps_the_mean() -> None:
    from servegate.capacity.latency.step_fit import ServingStep, fit_serving_steps

    rng = np.random.default_rng(1)
    truth = LatencyModel(TRUE)
    steps = []
    for _ in range(400):
        decodes = int(rng.integers(0, 24))
        chunks = [(1, int(rng.integers(10, 120))) for _ in range(decodes)]
        if rng.random() < 0.4 or not chunks:
            chunks.append((int(rng.integers(8, 64)), 0))
        arrivals, answered = int(rng.poisson(0.8)), int(rng.poisson(0.6))
        # skewed noise: most steps on time, some much slower (another thread had the interpreter)
        seconds = truth.step_time(chunks) + 0.003 * arrivals + 0.002 * answered + float(rng.exponential(0.002))
        steps.append(ServingStep(tuple(chunks), seconds, arrivals, after_completed=answered))
    fit = fit_serving_steps(steps)
    predicted = [fit.step_seconds(s) for s in steps]
    per_sequence = [len(s.chunks) for s in steps]  # the mean step as the requests in them see it
    assert np.average(predicted, weights=per_sequence) == pytest.approx(
        np.average([s.seconds for s in steps], weights=per_sequence), rel=0.01
    )
    assert fit.admission_s == pytest.approx(0.003, rel=0.2)
    assert fit.completion_s == pytest.approx(0.002, rel=0.2)
    assert fit.steps.c_decode_seq == pytest.approx(TRUE.c_decode_seq, rel=0.2)
    assert fit.error.steps == 400


def test_serving_fit_refuses_too_few_steps() -> None:
    from servegate.capacity.latency.step_fit import ServingStep, fit_serving_steps

    with pytest.raises(ValueError, match="need at least 32 serving steps"):
        fit_serving_steps([ServingStep(((1, 10),), 0.01, 0)] * 5)


def test_admission_delay_is_recovered_from_runs_that_show_it() -> None:
    from servegate.capacity.bench.workload import RequestSpec
    from servegate.capacity.latency.load_fit import fit_admission_delay
    from servegate.capacity.latency.serving_trace import TracedRun
    from servegate.capacity.latency.simulate import SimSetup, simulate

    model = LatencyModel(RUNNER, ServingOverheads(request_s=0.003))
    setup = SimSetup("continuous", 16, 0.0, 1024, False, num_blocks=512, block_size=16)
    rng = np.random.default_rng(2)
    specs = [RequestSpec(int(rng.integers(10, 60)), int(rng.integers(4, 12)), i * 0.01) for i in range(120)]
    slow = replace(model, overheads=replace(model.overheads, admission_delay_per_running_s=0.002))
    measured = simulate(setup, slow, specs, jitter=False).records
    delay = fit_admission_delay(model, setup, [TracedRun(specs, measured)])
    assert delay == pytest.approx(0.002, rel=0.1)
    # runs already slower in the model than measured give no delay
    assert (
        fit_admission_delay(slow, setup, [TracedRun(specs, simulate(setup, model, specs, jitter=False).records)]) == 0
    )


def test_step_scale_and_load_slowdown_are_recovered_from_runs_at_two_rates() -> None:
    from servegate.capacity.bench.workload import RequestSpec
    from servegate.capacity.latency.load_fit import fit_load_response, scaled_steps
    from servegate.capacity.latency.serving_trace import TracedRun
    from servegate.capacity.latency.simulate import SimSetup, simulate

    model = LatencyModel(RUNNER, ServingOverheads(request_s=0.003))
    setup = SimSetup("continuous", 16, 0.0, 1024, False, num_blocks=512, block_size=16)
    rng = np.random.default_rng(3)
    # what the server did: steps 10% faster than the fit when idle, 0.2% slower per request/s sent
    truth = scaled_steps(model, 0.9, 0.002)
    runs = []
    for rate in (20.0, 120.0):
        specs = [RequestSpec(int(rng.integers(10, 60)), int(rng.integers(4, 12)), i / rate) for i in range(80)]
        runs.append(TracedRun(specs, simulate(setup, truth, specs, jitter=False).records, rate))
    scale, slowdown = fit_load_response(model, setup, runs)
    assert scale == pytest.approx(0.9, abs=0.02)
    assert slowdown == pytest.approx(0.002, rel=0.2)
    # the fitted model predicts the busy run's mean end-to-end latency
    fitted = simulate(setup, scaled_steps(model, scale, slowdown), runs[1].specs, jitter=False).records
    assert np.mean([r.e2el for r in fitted]) == pytest.approx(np.mean([r.e2el for r in runs[1].records]), rel=0.03)
    # nothing to fit on: the model is left as it is
    assert fit_load_response(model, setup, []) == (1.0, 0.0)
