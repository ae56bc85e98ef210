"""Where a latency model comes from: the manifest and machine it was measured on, and how well each stage fit.

Profiles are kept as JSON files keyed by the served model (its fingerprint with batching at defaults)
and the kind of machine, under $SERVEGATE_HOME/profiles.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from servegate.capacity.bench.machine_speed import MachineSpeed
from servegate.capacity.latency.blackbox_fit import BlackBoxFit
from servegate.capacity.latency.terms import StepSample
from servegate.contracts.home import servegate_home


@dataclass(frozen=True)
class Provenance:
    """What was profiled, where and when."""

    key: str = ""
    """Profile key: fingerprint of the manifest with its batching section at defaults (prediction.profile_key)."""
    fingerprint: str = ""
    """Full fingerprint of the manifest that was profiled."""
    hardware: Mapping[str, Any] = field(default_factory=dict)
    """Where it was measured (see hardware_id)."""
    profiled_at: str | None = None
    """Local time the profile was finished (ISO 8601 with offset)."""
    load_average_1m: float | None = None
    """The machine's 1-minute load average when it was finished (other work on its cores)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Provenance:
        """Inverse of as_dict."""
        return cls(
            key=str(data.get("key", "")),
            fingerprint=str(data.get("fingerprint", "")),
            hardware=dict(data.get("hardware") or {}),
            profiled_at=data.get("profiled_at"),
            load_average_1m=data.get("load_average_1m"),
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able form."""
        return {**asdict(self), "hardware": dict(self.hardware)}


@dataclass(frozen=True)
class FitError:
    """How far the measured steps fall from a least-squares fit."""

    steps: int
    """Steps fitted."""
    median_rel_error: float
    """Median of |predicted - measured| / measured."""
    p90_rel_error: float
    """90th percentile of the same."""


@dataclass(frozen=True)
class Calibration:
    """What the serving-overhead stage found: inter-token gaps beyond the model-step prediction."""

    step_overhead_s: float
    """Seconds the serving path adds to every step (intercept of the gap residual against batch size)."""
    per_sequence_overhead_s: float
    """Seconds it adds per sequence in a step (the slope)."""
    requests: int
    """Requests measured."""
    gap_residual_by_batch_s: tuple[tuple[int, float], ...]
    """(batch size, mean measured gap minus predicted decode step in seconds) for each batch measured."""


@dataclass(frozen=True)
class TracedRunFit:
    """How the fitted model reproduces one traced run: measured against simulated means, milliseconds."""

    rate_rps: float
    requests: int
    measured_mean_ttft_ms: float
    simulated_mean_ttft_ms: float
    measured_mean_e2el_ms: float
    simulated_mean_e2el_ms: float
    probe_us: float | None = None
    """This machine's speed probe (machine_speed.py) during the run, microseconds."""


@dataclass(frozen=True)
class LoneReference:
    """Lone requests sent once the model was fitted: how they ran against its prediction (speed_check.py)."""

    requests: int
    measured_e2el_p50_ms: float
    predicted_e2el_p50_ms: float


@dataclass(frozen=True)
class FitQuality:
    """How well each profiling stage fit, and the numbers it measured on the way (None: the stage did not run)."""

    model_steps: FitError | None = None
    """Stage 1: the bare model steps against the step-cost fit."""
    step_samples: tuple[StepSample, ...] = ()
    """Stage 1's measured steps."""
    calibration: Calibration | None = None
    """Stage 2: the serving overheads seen in lone requests and bursts."""
    serving_steps: FitError | None = None
    """Stage 3: the steps the server ran under load against their refit."""
    serving_mean_step_s: float | None = None
    """Stage 3: mean duration of those steps."""
    traced_rates_rps: tuple[float, ...] = ()
    """Stage 3: the open-loop rates traced."""
    step_scale_under_load: float | None = None
    """Stage 4: the scale of the step costs chosen so that simulated traced runs match measured ones."""
    traced_runs: tuple[TracedRunFit, ...] = ()
    """Stage 4: each traced run, measured against simulated with the final model."""
    lone_reference: LoneReference | None = None
    """Lone requests after the fit (what `gate plan --verify`'s speed check compares with)."""
    machine_speed: MachineSpeed | None = None
    """This machine's speed while the traced runs were served (what the last fit matched)."""
    machine_speed_profile: MachineSpeed | None = None
    """Its speed over the whole profile."""
    black_box: BlackBoxFit | None = None
    """An engine profiled from outside (blackbox.py): its sweeps and the fit's error; the stages above did not run."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FitQuality:
        """Inverse of as_dict."""

        def speed(key: str) -> MachineSpeed | None:
            return MachineSpeed.from_dict(data[key]) if data.get(key) else None

        def part(kind: type, key: str) -> Any:
            return kind(**data[key]) if data.get(key) else None

        calibration = data.get("calibration")
        return cls(
            model_steps=part(FitError, "model_steps"),
            step_samples=tuple(
                StepSample(tuple((int(n), int(s)) for n, s in row["chunks"]), float(row["seconds"]))
                for row in data.get("step_samples") or ()
            ),
            calibration=Calibration(
                float(calibration["step_overhead_s"]),
                float(calibration["per_sequence_overhead_s"]),
                int(calibration["requests"]),
                tuple((int(b), float(r)) for b, r in calibration["gap_residual_by_batch_s"]),
            )
            if calibration
            else None,
            serving_steps=part(FitError, "serving_steps"),
            serving_mean_step_s=data.get("serving_mean_step_s"),
            traced_rates_rps=tuple(float(r) for r in data.get("traced_rates_rps") or ()),
            step_scale_under_load=data.get("step_scale_under_load"),
            traced_runs=tuple(TracedRunFit(**row) for row in data.get("traced_runs") or ()),
            lone_reference=part(LoneReference, "lone_reference"),
            machine_speed=speed("machine_speed"),
            machine_speed_profile=speed("machine_speed_profile"),
            black_box=BlackBoxFit.from_dict(data["black_box"]) if data.get("black_box") else None,
        )

    def as_dict(self, *, samples: bool = True) -> dict[str, Any]:
        """Plain JSON-able form (without the measured steps when not `samples`)."""
        out = asdict(self)  # nested dataclasses become dicts, tuples stay sequences
        out["machine_speed"] = self.machine_speed.as_dict() if self.machine_speed else None
        out["machine_speed_profile"] = self.machine_speed_profile.as_dict() if self.machine_speed_profile else None
        if self.calibration is not None:
            out["calibration"]["gap_residual_by_batch_s"] = [list(p) for p in self.calibration.gap_residual_by_batch_s]
        out["step_samples"] = [{"chunks": [list(c) for c in s.chunks], "seconds": s.seconds} for s in self.step_samples]
        if not samples:
            del out["step_samples"]
        return out


def hardware_id() -> dict[str, Any]:
    """What the latency was measured on: CPU model, cores, accelerator (read without importing torch)."""
    cpu = platform.processor() or platform.machine()
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        match = re.search(r"model name\s*:\s*(.+)", text)
        cpu = match.group(1).strip() if match else cpu
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": cpu, "cores": os.cpu_count() or 1, "machine": platform.machine()}
    gpus = sorted(Path("/proc/driver/nvidia/gpus").glob("*/information"))
    if gpus:
        match = re.search(r"Model:\s*(.+)", gpus[0].read_text(encoding="utf-8", errors="replace"))
        info["accelerator"] = match.group(1).strip() if match else "nvidia"
    torch = sys.modules.get("torch")  # recorded when already loaded (profiling), never imported just for this
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
    return info


def hardware_key(hardware: Mapping[str, Any]) -> str:
    """A short file-name-safe id of a machine kind."""
    text = f"{hardware.get('accelerator') or hardware.get('cpu')}-{hardware.get('cores')}c"
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:80]


def profiles_dir() -> Path:
    """Where profiles are kept: $SERVEGATE_HOME/profiles (default ~/.cache/servegate/profiles)."""
    return servegate_home() / "profiles"


def profile_path(key: str, hardware: Mapping[str, Any], directory: Path | None = None) -> Path:
    """File of the profile for a profile key on a machine kind."""
    return (directory or profiles_dir()) / f"{key[:16]}-{hardware_key(hardware)}.json"
