"""A single manifest's capacity miss on a machine that moved: inconclusive, never a failure.

`gate check M` benches the manifest's own server alone, so a missed absolute target is the server's or the
machine's, and one bench cannot tell which. On the 2-core VM, two spinning processes at nice 19 turned the
quickstart's 4 ms decode steps into 250 ms ones on two torch threads (benchmarks/README.md, "Threads and
contention"): a change that only shortened prompts failed its E2E target. So, for a server that runs here
(the reference runtime), a missed latency or throughput target counts only when the machine held still:

- during the bench: the contention probe saw the server's thread team stall or its threads wait for cores
  (capacity/bench/contention.py), the load average was over the CPUs (load_generator.py), or the Python
  loop's speed moved (machine_speed.py);
- else the control: the manifest's reference form (runtime.backend reference, every optimization off) is
  benched interleaved with the candidate, rounds A B, B A, ... with the same prompts, as a change is
  (capacity/bench/interleaved.py). The machine moved when the reference form's per-round step time
  (TPOT p50; E2E p50 for one-token outputs) spread over CONTROL_SPREAD (and CONTROL_FLOOR_MS), when the
  probe saw contention meanwhile, or when the candidate's miss did not repeat in that second bench.

Any of these: each missed latency or throughput target is a warning that names why, and the gate's verdict
is inconclusive. A miss that repeats on a machine that held still stays a failure; memory is never excused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from servegate.capacity.bench.contention import Contention
from servegate.capacity.bench.interleaved import InterleavedRuns
from servegate.capacity.bench.target_bounds import latencies_ms
from servegate.gates.audits.capacity_paired import CapacityVerdict, VerdictName

CONTROL_SPREAD = 1.5
"""The reference form's slowest round over its fastest (p50 step time): above this, the machine moved."""
CONTROL_FLOOR_MS = 2.0
"""...and only when the rounds differ by more than this: below it, timer resolution and jitter, not the machine."""

MOVED = (
    "; the machine moved during the bench ({why}): the miss may be the machine's, not the server's, so it is "
    "inconclusive; bench it on a quiet machine or gate the change against its baseline (--baseline)"
)
"""Appended to each excused miss."""


def machine_reasons(report: dict[str, Any], contention: Contention | None) -> list[str]:
    """Why the machine did not hold still during a bench (its report and what the probe saw); [] when it did."""
    from servegate.capacity.bench.machine_speed import MachineSpeed

    reasons = _contended(contention)
    load = report.get("load_average")
    if load and load.get("oversubscribed"):
        reasons.append(f"load average {max(load['before'], load['after']):.1f} on {load['cpus']} CPUs")
    if report.get("machine_speed"):
        speed = MachineSpeed.from_dict(report["machine_speed"])
        if not speed.steady:
            reasons.append(f"this machine's speed moved by {speed.spread:.2f}x")
    return reasons


def _contended(contention: Contention | None) -> list[str]:
    """The probe's reasons, each said as the server's cores' (none without a probe)."""
    return [f"the server's cores were contended: {r}" for r in (contention.reasons if contention else [])]


def _excusable(check: dict[str, Any]) -> bool:
    """A failed latency or throughput target (one a moving machine can cause; memory is not)."""
    return check.get("verdict") == "fail" and check.get("name") != "memory"


def has_excusable_miss(verdict: CapacityVerdict) -> bool:
    """Whether a latency or throughput target failed (the ones a moving machine can cause)."""
    return any(_excusable(c) for c in verdict.checks)


def excuse(verdict: CapacityVerdict, reasons: Sequence[str]) -> CapacityVerdict:
    """Each failed latency or throughput target as a warning naming `reasons`; the worst verdict again."""
    if not reasons or not has_excusable_miss(verdict):
        return verdict
    why = "; ".join(reasons)
    checks = [{**c, "verdict": "warn", "machine_moved": True} if _excusable(c) else c for c in verdict.checks]
    # the misses keep their sentences; a failed memory budget stays a failure beside them
    worst: VerdictName = "fail" if any(c.get("verdict") == "fail" for c in checks) else "warn"
    return CapacityVerdict(worst, verdict.reason + MOVED.format(why=why), checks)


@dataclass(frozen=True)
class Control:
    """The reference form benched interleaved with the candidate after a miss: whether the machine held."""

    metric: str
    """`tpot_ms` or `e2e_ms`: the reference form's per-round p50 compared."""
    rounds_ms: list[float]
    """The reference form's p50 of `metric` per round."""
    candidate_verdict: str
    """The candidate's verdict judged on its own records of the interleaved bench."""
    contention: Contention | None = None
    """What the probe saw during the control."""
    reasons: list[str] = field(default_factory=list)
    """Why the machine counts as moved (empty: it held)."""

    @property
    def spread(self) -> float:
        """The slowest round over the fastest."""
        low = min(self.rounds_ms, default=0.0)
        return max(self.rounds_ms) / low if low > 0 else float("nan")

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "reference_form_metric": self.metric,
            "reference_form_round_p50_ms": self.rounds_ms,
            "reference_form_spread": self.spread,
            "candidate_verdict": self.candidate_verdict,
            "contention": self.contention.as_dict() if self.contention else None,
            "machine_moved": bool(self.reasons),
            "reasons": list(self.reasons),
        }


def judge_control(runs: InterleavedRuns, candidate_verdict: str, contention: Contention | None) -> Control:
    """The control's verdict on the machine from the reference form's rounds and the candidate's second bench."""
    tpot = [latencies_ms(r, "tpot_ms") for r in runs.baseline]
    metric = "tpot_ms" if all(v.size for v in tpot) else "e2e_ms"
    per_round = tpot if metric == "tpot_ms" else [latencies_ms(r, "e2e_ms") for r in runs.baseline]
    rounds = [float(np.median(v)) for v in per_round if v.size]
    control = Control(metric, rounds, candidate_verdict, contention)
    reasons = _contended(contention)
    if rounds and not control.spread <= CONTROL_SPREAD and max(rounds) - min(rounds) > CONTROL_FLOOR_MS:
        reasons.append(
            f"the reference form, benched interleaved with it, ran its rounds at {min(rounds):.3g}-"
            f"{max(rounds):.3g} ms {metric.removesuffix('_ms').upper()} p50 ({control.spread:.2f}x, over "
            f"{CONTROL_SPREAD:g}x)"
        )
    if candidate_verdict != "fail":
        reasons.append(
            f"the miss did not repeat in a second bench interleaved with the reference form ({candidate_verdict})"
        )
    return replace(control, reasons=reasons)


def held_note(control: Control) -> str:
    """What a failure that held in the control says about it."""
    return (
        f"; it held in a second bench interleaved with the reference form, whose rounds ran at "
        f"{min(control.rounds_ms):.3g}-{max(control.rounds_ms):.3g} ms {control.metric.removesuffix('_ms').upper()} "
        f"p50 ({control.spread:.2f}x): the machine held still"
    )
