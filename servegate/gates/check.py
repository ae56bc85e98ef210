"""`gate check` orchestration: which gates run (and why), running them, and the report.

A single manifest is checked against its own reference form (every optimization off); two manifests
are checked as a change. Either way the field diff, through the fields each registered gate watches
(`contracts.diff.GATE_WATCHES` for the built-in ones), decides which gates run; the report says for
every gate why it ran or why it was skipped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

from servegate.contracts.diff import diff_manifests, gates_for_changes
from servegate.contracts.errors import RemoteUnavailable
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.check_report import ManifestSide
from servegate.gates.base import (
    CheckResources,
    EngineFactory,
    EnginePool,
    GateContext,
    ProgressHook,
    remote_label,
)
from servegate.gates.gate_jobs import Jobs, run_scheduled, schedule
from servegate.gates.registry import GATES, gate_watches
from servegate.gates.result import GateReport, GateResult
from servegate.gates.run_gates import PlannedGate as PlannedGate
from servegate.gates.suites.output_cache import OutputCache
from servegate.gates.time_split import TimeSplit

ORDER = ("contract", "quantization", "truncation", "caching", "batching", "load", "fallback", "quality", "capacity")
"""Built-in gates in the order they run and are reported (cheap and widely shared baselines first)."""

ALWAYS_IN_REFERENCE_MODE = ("contract",)
"""Gates that check a manifest's own promises, so they run on every single-manifest check."""


def _summary(paths: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" (+{len(paths) - limit} more)" if len(paths) > limit else "")


def plan_gates(
    baseline: ServedModel,
    candidate: ServedModel,
    *,
    mode: Literal["reference", "change"] = "change",
    forced: Sequence[str] = (),
) -> list[PlannedGate]:
    """Every registered gate with run/skip and the reason; unknown `forced` names raise with a suggestion."""
    for name in forced:
        GATES.entry(name)  # raises "unknown gate ...; did you mean ...? Available: ..."
    triggered = gates_for_changes(diff_manifests(baseline, candidate, gate_watches()))
    planned = []
    for entry in sorted(GATES, key=lambda e: ORDER.index(e.name) if e.name in ORDER else len(ORDER)):
        name, paths = entry.name, tuple(triggered.get(entry.name, ()))
        if forced:
            if name in forced:
                planned.append(PlannedGate(name, True, "forced by --gate", paths, forced=True))
            else:
                planned.append(PlannedGate(name, False, "not selected (--gate names other gates)", paths))
        elif paths:
            planned.append(PlannedGate(name, True, f"changed: {_summary(paths)}", paths))
        elif mode == "reference" and name in ALWAYS_IN_REFERENCE_MODE:
            planned.append(PlannedGate(name, True, "checked for every manifest (its own contract)"))
        else:
            watched = ", ".join(entry.metadata.get("watches", ())) or "nothing"
            planned.append(PlannedGate(name, False, f"no watched field changed (watches {watched})"))
    return planned


def evaluation_baseline(reference: ServedModel, candidate: ServedModel) -> ServedModel:
    """The baseline that quality comparisons run on: the reference form under the candidate's batching.

    Both sides of every paired comparison then run under the same batching, so the gated fields are the
    only difference, and suites run batched instead of one request at a time. That batching gives the
    unbatched reference's outputs token for token is what the batching gate checks, against `batching:
    none`, in the same run. When the candidate's batching does not fit the reference form, the reference
    form itself is used.
    """
    if candidate.batching.mode == "none":
        return reference
    try:
        return reference.with_changes(batching=candidate.batching)
    except ValueError:  # pydantic's ValidationError: e.g. a token budget below the reference's input limit
        return reference


def run_check(
    baseline: ServedModel,
    candidate: ServedModel,
    *,
    mode: Literal["reference", "change"] = "change",
    forced: Sequence[str] = (),
    engine_factory: EngineFactory | None = None,
    cache: OutputCache | None = None,
    progress: ProgressHook | None = None,
    jobs: Jobs = 1,
) -> GateReport:
    """Plan, run every selected gate on shared engines and suites, and collect the report.

    In reference mode `baseline` is the reference form; quality comparisons run on its
    `evaluation_baseline`, and the batching gate compares with it unbatched. `jobs` above 1 (or `auto`) runs the
    gates that time nothing in that many processes at once, and the rest alone after them (gate_jobs.py).
    """
    split = TimeSplit()  # from here: the plan, the suites and the remote's probe are the split's "setup"
    began = split.started
    planned = plan_gates(baseline, candidate, mode=mode, forced=forced)
    pool = EnginePool(engine_factory)
    evaluated = evaluation_baseline(baseline, candidate) if mode == "reference" else baseline
    ctx = GateContext(
        evaluated,
        candidate,
        mode,
        reference=baseline,
        progress=progress or ProgressHook(),
        resources=CheckResources(engines=pool, cache=cache or OutputCache(), split=split),
    )
    if any(p.run for p in planned):
        ctx.suites()  # a suite that cannot be loaded is a manifest error (exit 2), not a gate failure
    side = _identity(baseline, "reference form" if mode == "reference" else "manifest")
    try:
        ctx.remote = _probe_remote(ctx, planned)
    except RemoteUnavailable as exc:  # nothing can be measured: every gate that would run says why
        pool.close()
        results = [
            GateResult(p.name, "unavailable" if p.run else "skipped", str(exc) if p.run else p.why,
                       triggered_by=[p.why] if p.run else list(p.changed_paths))
            for p in planned
        ]  # fmt: skip
        return GateReport(
            baseline=side,
            candidate=_identity(candidate, "manifest"),
            gates=results,
            mode=mode,
            duration_s=time.perf_counter() - began,
            notes=[f"the candidate's remote could not be measured: {exc}"],
            time_split=split.as_dict(),
        )
    plan = schedule(planned, [baseline, evaluated, candidate], jobs, own_engines=pool.runtime_engines)
    ran = run_scheduled(ctx, planned, pool, plan)
    notes = _notes(ctx, baseline, evaluated)
    if plan.note():
        notes.insert(0, plan.note())
    return GateReport(
        baseline=side,
        candidate=_identity(candidate, "manifest", ctx.remote),
        gates=ran.results,
        mode=mode,
        duration_s=time.perf_counter() - began,
        notes=notes,
        time_split={**split.as_dict(), **ran.splits},
        processes=ran.processes,
    )


def _notes(ctx: GateContext, baseline: ServedModel, evaluated: ServedModel) -> list[str]:
    """What the report says about how the check ran: the remote, the batching of the suites, the cache."""
    notes = []
    if ctx.remote is not None:
        notes.append(
            f"candidate ran on {remote_label(ctx)}; its fingerprint covers the engine the remote reported, not its URL"
        )
    if evaluated is not baseline:
        notes.append(
            f"suites ran under batching {evaluated.batching.mode} on both sides of every comparison; "
            "the batching gate compares that batching with the unbatched reference"
        )
    cache = ctx.resources.cache
    if cache.enabled:
        notes.append(cache.summary())
    return notes


def _probe_remote(ctx: GateContext, planned: Sequence[PlannedGate]) -> Any:
    """Start a remote candidate's engine before any gate runs: its identity, or RemoteUnavailable at once."""
    if not ctx.candidate.runtime.remote or not any(p.run for p in planned):
        return None
    return ctx.engines.get(ctx.candidate).identity  # the pool starts it


def _identity(served: ServedModel, form: str, remote: Any = None) -> ManifestSide:
    """A side of the report: name, version, fingerprint; for a remote, the identity it reported (fingerprinted)."""
    out: dict[str, Any] = {
        "name": served.name,
        "version": served.version,
        "fingerprint": served.fingerprint,
        "form": form,
        "source": str(served.source) if served.source else "",
    }
    if remote is not None:
        recorded = served if served.runtime.engine is not None else served.with_engine(remote.as_engine())
        out.update(fingerprint=recorded.fingerprint, declared_fingerprint=served.fingerprint, remote=remote.to_dict())
    return ManifestSide.model_validate(out)


def check_manifest(served: ServedModel, **kwargs: Any) -> GateReport:
    """`gate check MANIFEST`: the manifest against its own reference form (`kwargs`: run_check's options)."""
    return run_check(served.reference_form(), served, mode="reference", **kwargs)
