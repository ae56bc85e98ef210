"""`gate profile`'s stages each return a new latency model and leave the one given unchanged; saved profiles load."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from capacity_helpers import STEP_MODEL, manifest

from servegate.capacity.bench.machine_speed import MachineSpeed
from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.bench.workload import RequestSpec
from servegate.capacity.latency.load_fit import match_admission_delay, match_load_response
from servegate.capacity.latency.model import PROFILE_FORMAT, LatencyModel
from servegate.capacity.latency.prediction import load_profile, profile_key
from servegate.capacity.latency.profile import fit_model_steps, with_provenance
from servegate.capacity.latency.provenance import (
    Calibration,
    FitError,
    FitQuality,
    LoneReference,
    Provenance,
    TracedRunFit,
    hardware_id,
    profile_path,
)
from servegate.capacity.latency.serving_trace import TracedRun, refit_on_serving
from servegate.capacity.latency.simulate import SimSetup, simulate
from servegate.capacity.latency.step_fit import ServingStep
from servegate.capacity.latency.terms import ServingOverheads, StepCost, StepJitter, StepSample
from servegate.contracts.errors import ServegateError

TRUE = StepCost(c_step=0.004, c_prefill_token=0.0001, c_decode_seq=0.0008)
SETUP = SimSetup("continuous", 16, 0.0, 1024, False, num_blocks=512, block_size=16)


def traced_runs(truth: LatencyModel, rates: tuple[float, ...] = (20.0, 80.0), count: int = 30) -> list[TracedRun]:
    """Open-loop runs `truth` serves in simulation, as stage 3 would have measured them."""
    rng = np.random.default_rng(4)
    runs = []
    for rate in rates:
        specs = [RequestSpec(int(rng.integers(10, 60)), int(rng.integers(4, 10)), i / rate) for i in range(count)]
        runs.append(TracedRun(specs, simulate(SETUP, truth, specs, jitter=False).records, rate))
    return runs


def test_stage_1_fits_model_steps_into_a_new_model_with_its_fit_quality() -> None:
    samples = [StepSample(((n, 0),), TRUE.seconds([(n, 0)])) for n in (2, 4, 8, 16, 32, 64)]
    samples += [StepSample(((1, 31),) * b, TRUE.seconds([(1, 31)] * b)) for b in (1, 2, 4, 8)]
    model = fit_model_steps(samples)
    assert model.step_time([(1, 31)] * 4) == pytest.approx(TRUE.seconds([(1, 31)] * 4), rel=1e-6)
    assert model.fit.model_steps is not None and model.fit.model_steps.steps == 10
    assert model.fit.step_samples == tuple(samples) and model.jitter.spread == pytest.approx(0.0, abs=1e-6)
    assert model.overheads == ServingOverheads()  # nothing about serving is known yet


def test_stage_3_refits_on_serving_steps_into_a_new_model() -> None:
    rng = np.random.default_rng(5)
    steps = []
    for _ in range(120):
        chunks = tuple((1, int(rng.integers(10, 80))) for _ in range(int(rng.integers(1, 12))))
        arrivals = int(rng.poisson(0.5))
        steps.append(ServingStep(chunks, TRUE.seconds(chunks) + 0.002 * arrivals, arrivals))
    single = [RequestRecord(0.0, 0.0, [0.01, 0.02], 0.021, output_tokens=2, prompt_tokens=16)]
    before = dataclasses.replace(STEP_MODEL)
    model = refit_on_serving(STEP_MODEL, steps, single)
    assert STEP_MODEL == before and model is not STEP_MODEL
    assert model.overheads.arrival_s == pytest.approx(0.002, rel=0.05)
    assert model.steps.c_decode_seq == pytest.approx(TRUE.c_decode_seq, rel=0.05)
    assert model.fit.serving_steps is not None and model.fit.serving_steps.steps == 120
    assert model.overheads.request_s == pytest.approx(0.01 - model.prefill_time(16))


def test_stages_4_and_5_match_traced_runs_into_new_models() -> None:
    truth = LatencyModel(TRUE.scaled(1.1), ServingOverheads(request_s=0.003, admission_delay_per_running_s=0.002))
    start = LatencyModel(TRUE, ServingOverheads(request_s=0.003))
    runs = traced_runs(truth)
    scaled = match_load_response(start, SETUP, runs)
    assert start.fit.step_scale_under_load is None and start.steps == TRUE  # the model given is unchanged
    assert scaled.fit.step_scale_under_load is not None and scaled.fit.step_scale_under_load > 1.0
    delayed = match_admission_delay(scaled, SETUP, runs)
    assert scaled.overheads.admission_delay_per_running_s == 0.0
    assert delayed.overheads.admission_delay_per_running_s > 0.0
    assert delayed.steps == scaled.steps and delayed.fit == scaled.fit


def test_with_provenance_records_the_manifest_the_machine_and_each_traced_run(model_dir: Path) -> None:
    served = manifest(model_dir)
    lone = LoneReference(8, 20.0, 21.0)
    model = with_provenance(STEP_MODEL, served, traced_runs(STEP_MODEL, (30.0,)), lone)
    assert STEP_MODEL.provenance == Provenance()
    assert model.provenance.key == profile_key(served) and model.provenance.fingerprint == served.fingerprint
    assert model.provenance.hardware == hardware_id() and model.provenance.profiled_at
    assert model.fit.traced_rates_rps == (30.0,) and model.fit.lone_reference == lone
    [row] = model.fit.traced_runs
    assert row.requests == 30 and row.simulated_mean_e2el_ms > 0


def test_a_latency_model_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        STEP_MODEL.steps = TRUE  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        STEP_MODEL.overheads.request_s = 1.0  # type: ignore[misc]


def full_model(served_key: str) -> LatencyModel:
    """A model with every part filled in, as `gate profile` leaves it."""
    fit = FitQuality(
        model_steps=FitError(10, 0.02, 0.05),
        step_samples=(StepSample(((16, 0),), 0.004), StepSample(((1, 15), (1, 31)), 0.006)),
        calibration=Calibration(0.001, 0.0002, 24, ((1, 0.0011), (8, 0.0027))),
        serving_steps=FitError(400, 0.1, 0.3),
        serving_mean_step_s=0.007,
        traced_rates_rps=(5.0, 30.0),
        step_scale_under_load=0.97,
        traced_runs=(TracedRunFit(5.0, 30, 12.0, 11.5, 80.0, 79.0, probe_us=210.0),),
        lone_reference=LoneReference(8, 60.0, 58.0),
        machine_speed=MachineSpeed(210.0, {0: 205.0, 1: 215.0}, 200.0, 220.0, 90, 4.5),
    )
    return LatencyModel(
        TRUE,
        ServingOverheads(
            request_s=0.002,
            finish_s=0.0005,
            arrival_s=0.0003,
            completion_s=0.0001,
            load_slowdown_per_rps=0.001,
            admission_delay_per_running_s=0.0004,
        ),
        StepJitter(0.12, 0.4),
        Provenance(served_key, "f" * 64, hardware_id(), "2026-12-02T00:10:00+0000", 1.5),
        fit,
        runtime_overhead_bytes=123_456_789,
    )


def test_a_saved_profile_loads_back_to_the_same_model(tmp_path: Path, monkeypatch, model_dir: Path) -> None:
    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path / "home"))
    served = manifest(model_dir)
    model = full_model(profile_key(served))
    model.save(profile_path(model.provenance.key, model.provenance.hardware))
    assert load_profile(served) == model
    saved = json.loads(profile_path(model.provenance.key, model.provenance.hardware).read_text())
    assert saved["format"] == PROFILE_FORMAT and saved["steps"]["c_step"] == TRUE.c_step
    assert "step_samples" not in model.as_dict(samples=False)["fit"]


def test_a_profile_of_the_old_flat_format_is_refused_with_the_command_that_remakes_it(
    tmp_path: Path, monkeypatch, model_dir: Path
) -> None:
    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path / "home"))
    served = manifest(model_dir)
    path = profile_path(profile_key(served), hardware_id())
    path.parent.mkdir(parents=True)
    old = {"coefficients": {"c_step": 0.004}, "request_overhead_s": 0.002, "key": profile_key(served), "fit": {}}
    path.write_text(json.dumps(old))
    with pytest.raises(ServegateError, match=r"latency profile of format 1; .* run `gate profile` on the manifest"):
        load_profile(served)


def test_the_one_term_variant_fits_the_step_scale_alone() -> None:
    from servegate.capacity.latency.load_fit import fit_load_response

    truth = LatencyModel(TRUE.scaled(1.1), ServingOverheads(request_s=0.003, arrival_s=0.001))
    start = LatencyModel(TRUE, ServingOverheads(request_s=0.003, arrival_s=0.001))
    runs = traced_runs(truth)
    scale, per_rps = fit_load_response(start, SETUP, runs, slowdown=False)
    assert per_rps == 0.0 and scale == pytest.approx(1.1, abs=0.02)
    one = match_load_response(start, SETUP, runs, slowdown=False)
    assert one.overheads.load_slowdown_per_rps == 0.0 and one.overheads.admission_delay_per_running_s == 0.0
    assert one.overheads.arrival_s == pytest.approx(0.001 * scale)


def test_gate_profile_saves_the_model_and_prints_each_part(tmp_path: Path, monkeypatch, model_dir: Path) -> None:
    import io

    from rich.console import Console

    from servegate.capacity.latency import profile as profiling
    from servegate.cli.profile import profile_and_save

    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path / "home"))
    served = manifest(model_dir)
    model = full_model(profile_key(served))
    monkeypatch.setattr(profiling, "profile_manifest", lambda served, **kw: model)
    out = io.StringIO()
    returned, path = profile_and_save(served, Console(file=out, width=300))
    assert returned == model and LatencyModel.load(path) == model
    said = out.getvalue()
    assert "bare model steps fitted over 10 steps: median error 2.0%, p90 5.0%" in said
    assert "serving steps under load fitted over 400 steps" in said and "step jitter 12.0%" in said
    assert "2.00 ms before the first token, 0.50 ms after the last, 0.300 ms per request admitted" in said
    assert "c_step=0.004" in said and "this machine while serving the traced runs" in said
