"""Running planned gates in one process: build each once, prepare them all, run each in order, release them.

`gate check` runs every gate through here, in its own process or, with `--jobs`, in a worker process beside it
(gate_jobs.py); either way a gate's failure to run is its own failing verdict and a bug in a gate propagates.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from servegate.gates.base import EnginePool, Gate, GateContext, timed
from servegate.gates.checks import (  # noqa: F401 - importing a gate module registers its gates
    batching,
    caching,
    capacity,
    contract,
    fallback,
    load,
    quality,
    quantization,
    truncation,
)
from servegate.gates.registry import GATES
from servegate.gates.result import GateResult


@dataclass(frozen=True)
class PlannedGate:
    """A gate `gate check` will run or skip, and why."""

    name: str
    run: bool
    why: str
    changed_paths: tuple[str, ...] = ()
    forced: bool = False


def skipped(plan: PlannedGate) -> GateResult:
    """The result of a gate the plan skips: why, and the changed fields it watches (none, or not selected)."""
    return GateResult(plan.name, "skipped", plan.why, triggered_by=list(plan.changed_paths))


def run_planned(
    ctx: GateContext,
    planned: Sequence[PlannedGate],
    pool: EnginePool,
    *,
    before: Collection[str] = (),
    wait: Callable[[], None] | None = None,
) -> list[GateResult]:
    """Build each gate that will run once, prepare them all, run each in order (skipped ones say why), then
    release what they prepared and did not use, and close the pool.

    `wait` (the workers of `gate check --jobs`) is called once, before the first gate named in `before` runs, or
    after the last gate when none is.
    """
    results: list[GateResult] = []
    gates: dict[str, Gate] = {}
    waiting = wait
    try:
        for plan in planned:
            if plan.run:
                gates[plan.name] = GATES.get(plan.name)()
                gates[plan.name].prepare(ctx)
        for plan in planned:
            if not plan.run:
                results.append(skipped(plan))
                continue
            if waiting is not None and plan.name in before:
                waiting()
                waiting = None
            results.append(_run_one(ctx, plan, gates[plan.name]))
        if waiting is not None:
            waiting()
    finally:
        try:
            for built in gates.values():
                built.release()
        finally:
            pool.close()
    return results


def _run_one(ctx: GateContext, plan: PlannedGate, gate: Gate) -> GateResult:
    """One gate's result, charged to its row of the time split; an error while it runs is its failing verdict."""
    gate_ctx = replace(ctx, changed_paths=list(plan.changed_paths), forced=plan.forced)
    began = time.perf_counter()
    try:
        with ctx.split.gate(plan.name):
            result = timed(gate, gate_ctx)
    except Exception as exc:
        if os.environ.get("SERVEGATE_DEBUG") == "1" or not is_runtime_failure(exc):
            raise
        result = GateResult(plan.name, "fail", f"could not run: {type(exc).__name__}: {exc}")
        result.duration_s = round(time.perf_counter() - began, 3)  # timed() did not return to time it
    result.triggered_by = [plan.why]
    return result


def is_runtime_failure(exc: BaseException) -> bool:
    """Errors raised while a gate runs (the engine, the model, a server, a bench): that gate's failure.

    Programming errors still propagate, so a bug in a gate is never mistaken for a verdict.
    """
    return not isinstance(exc, (AssertionError, TypeError, NameError, AttributeError, KeyError, IndexError))
