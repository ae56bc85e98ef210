"""Whether the machine still runs at the speed it was profiled at: lone requests, predicted against measured.

A latency model is fitted at one moment; a shared machine's speed moves (on the 2-core VM of
benchmarks/README.md the bare model step moved by a factor of 1.7 within a minute), and near the knee
queueing multiplies any such change. `gate plan --verify` therefore first sends a few requests one at a
time, where no queueing amplifies anything, and compares their end-to-end latency with what the profile
predicts for them: the ratio says how much of the errors that follow is the machine, not the model.

The model itself can be off for lone requests (its step costs are fitted on steps served under load), so
`gate profile` sends the same lone requests once the model is fitted and keeps how they ran against its
prediction; the check expects that same ratio, and reports only a change from it.

Lone requests are sent before the bench, so they cannot see the machine change during it: the bench's
own sample of the machine's speed (machine_speed.py), against the one the profile kept, says that
(machine_comparison).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from servegate.capacity.bench.machine_speed import MachineSpeed
from servegate.capacity.bench.workload import make_requests
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.prediction import sim_setup
from servegate.capacity.latency.simulate import simulate
from servegate.contracts.capacity_section import Workload
from servegate.contracts.manifest import ServedModel

SPEED_CHECK_REQUESTS = 8
"""Lone requests the check sends (the workload's lengths, one in flight)."""

DRIFT_WARNING = 0.10
"""A lone request this much slower or faster than predicted: the machine's speed has moved since profiling."""


def lone_workload(workload: Workload, num_requests: int = SPEED_CHECK_REQUESTS) -> Workload:
    """The workload's request shapes, sent one at a time (closed loop at concurrency 1)."""
    return workload.model_copy(
        update={"arrival": "closed", "concurrency": 1, "rate_rps": None, "num_requests": num_requests}
    )


def predicted_lone_e2e_ms(served: ServedModel, model: LatencyModel, lone: Workload, seed: int = 0) -> float:
    """The profile's p50 end-to-end latency (ms) for `lone`: the median over 5 simulations of the same requests
    (jitter seeds 0-4), as benchmarks/planner_accuracy.py takes its predictions."""
    specs = make_requests(lone, seed)
    setup = sim_setup(served)
    runs = [simulate(setup, model, specs, concurrency=1, seed=s).summary()["e2el_ms"]["p50"] for s in range(5)]
    return float(statistics.median(runs))


def profile_lone_bias(model: LatencyModel) -> float:
    """Measured over predicted p50 of the lone requests `gate profile` sent after fitting `model` (1.0 for a
    profile made before it kept them)."""
    reference = model.fit.lone_reference
    if reference is None or not reference.measured_e2el_p50_ms or not reference.predicted_e2el_p50_ms:
        return 1.0
    return float(reference.measured_e2el_p50_ms / reference.predicted_e2el_p50_ms)


@dataclass(frozen=True)
class SpeedCheck:
    """Lone requests: the p50 end-to-end latency the profile leads one to expect against the measured one."""

    predicted_ms: float
    """The profile's prediction for these requests."""
    measured_ms: float
    requests: int
    profiled_at: str | None = None
    bias: float = 1.0
    """Measured over predicted for lone requests when the profile was made (profile_lone_bias)."""

    @property
    def expected_ms(self) -> float:
        """What the requests should take on the machine as it was when profiled."""
        return self.predicted_ms * self.bias

    @property
    def ratio(self) -> float:
        """Measured over expected: above 1, the machine is slower now than when it was profiled."""
        return self.measured_ms / self.expected_ms if self.expected_ms > 0 else float("nan")

    @property
    def drifted(self) -> bool:
        """Whether the machine's speed moved by more than DRIFT_WARNING since profiling."""
        return not abs(self.ratio - 1.0) <= DRIFT_WARNING

    def lines(self) -> list[str]:
        """What `gate plan --verify` prints."""
        when = f" of {self.profiled_at}" if self.profiled_at else ""
        basis = (
            f" (the prediction, {self.predicted_ms:.1f} ms, x {self.bias:.2f} as lone requests ran when profiled)"
            if abs(self.bias - 1.0) >= 0.005
            else ""
        )
        head = (
            f"speed check: {self.requests} lone requests took {self.measured_ms:.1f} ms (p50 end-to-end) against "
            f"{self.expected_ms:.1f} ms expected from the profile{when}{basis}: {self.ratio:.2f}x"
        )
        if not self.drifted:
            return [head]
        pace = "slower" if self.ratio > 1 else "faster"
        return [
            head,
            f"  the machine runs {pace} than when it was profiled: the errors below include that change "
            "(queueing near the knee multiplies it); `gate profile` again measures the machine as it is now",
        ]

    def as_dict(self) -> dict[str, Any]:
        """The check for the plan's JSON."""
        return {
            "requests": self.requests,
            "predicted_e2el_p50_ms": self.predicted_ms,
            "profile_lone_bias": self.bias,
            "expected_e2el_p50_ms": self.expected_ms,
            "measured_e2el_p50_ms": self.measured_ms,
            "measured_over_expected": self.ratio,
            "drifted": self.drifted,
            "profiled_at": self.profiled_at,
        }


def machine_comparison(model: LatencyModel, measured: dict[str, Any]) -> dict[str, Any] | None:
    """How fast this machine ran during a bench (`measured`, a bench report) against while the profile's traced
    runs were served (machine_speed.py); None when either was not sampled."""
    then, sampled = model.fit.machine_speed, measured.get("machine_speed")
    if then is None or not sampled or not then.probe_us:
        return None
    now = MachineSpeed.from_dict(sampled)
    ratio = now.relative_to(then)
    return {
        "profile_probe_us": then.probe_us,
        "bench_probe_us": now.probe_us,
        "bench_over_profile": ratio,
        "bench_spread": now.spread,
        "bench_steady": now.steady,
        "moved": not abs(ratio - 1.0) <= DRIFT_WARNING or not now.steady,
    }


def machine_comparison_lines(comparison: dict[str, Any] | None) -> list[str]:
    """What `gate plan --verify` prints of machine_comparison."""
    if comparison is None:
        return []
    ratio = comparison["bench_over_profile"]
    head = (
        f"machine: a Python loop took {comparison['bench_probe_us']:.0f} us during the bench against "
        f"{comparison['profile_probe_us']:.0f} us while profiling ({ratio:.2f}x; spread within the bench "
        f"{comparison['bench_spread']:.2f}x)"
    )
    if not comparison["moved"]:
        return [head + ": the same speed"]
    if abs(ratio - 1.0) > DRIFT_WARNING:
        what = f"the machine ran {'slower' if ratio > 1 else 'faster'} than when it was profiled"
    else:
        what = "the machine's speed moved during the bench"
    return [head, f"  {what} (other work on its cores): the errors below include that, not only the model's"]
