"""The capacity gate: the declared targets hold when the declared workload is run against the served model.

When `capacity.targets` are declared it benches the manifest's own server (or its endpoint) at
`capacity.workload` and fails when a target is missed: a latency percentile over budget, throughput
under its floor, or memory over its budget. Memory is what the server process it ran used at its peak
(resident: interpreter, torch, weights, KV pool, a fallback's engine); for an endpoint, what the remote
itself reports of its whole deployment, and when it cannot (vLLM's /metrics covers its API process, not
the engine processes that hold the model) the memory target is not checked and the gate warns, naming
why: a plan is never taken for a measurement. Latencies count from each request's scheduled send time,
so queueing is never hidden.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from servegate.capacity.bench.contention import (
    Contention,
    ContentionProbe,
    judge_contention,
    run_queue_times,
    wait_share_between,
)
from servegate.capacity.bench.interleaved import InterleavedRuns
from servegate.capacity.bench.own_server import bench_url, manifest_tokenizer, own_server, peak_memory
from servegate.capacity.bench.run_metrics import slo_from_targets
from servegate.capacity.bench.targets import PromptFactory
from servegate.capacity.planning.target_checks import TargetCheck, check_targets
from servegate.contracts.diff import GATE_WATCHES
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.measurements import CapacityMeasurements
from servegate.gates.audits.capacity_machine import (
    Control,
    excuse,
    has_excusable_miss,
    held_note,
    judge_control,
    machine_reasons,
)
from servegate.gates.audits.capacity_paired import (
    CapacityVerdict,
    as_bench_result,
    bench_change_sides,
    bench_interleaved,
    judge,
    paired_mode,
)
from servegate.gates.base import Gate, GateContext
from servegate.gates.registry import register_gate
from servegate.gates.result import GateResult


class _RunningVllm:
    """The vLLM server a vllm-backend engine started, as the server this gate benches and measures."""

    memory_note = "memory: resident memory of vLLM's processes (API server, engine core, workers) after the bench"

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.url = engine.base_url.removesuffix("/v1")

    def __enter__(self) -> _RunningVllm:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def peak_rss_bytes(self) -> int | None:
        """vLLM's process group, resident, now."""
        return self.engine.memory_bytes()


def _remote_memory(served: ServedModel, remote: Any) -> tuple[int | None, str]:
    """The remote's memory as its /metrics says it for the whole deployment, else None and why not."""
    import asyncio

    from servegate.runtime.remote.identity import RemoteIdentity, remote_memory

    identity = remote or RemoteIdentity("unknown", None, ())
    return asyncio.run(remote_memory(served.runtime.endpoint_url or "", identity))


def _memory(served: ServedModel) -> Any:
    """The manifest's memory plan, or None when its config cannot be read (e.g. a remote-only model)."""
    from servegate.capacity.memory.plan import manifest_memory

    try:
        return manifest_memory(served)
    except (ServegateError, OSError, ValueError):
        return None


@dataclass
class CapacityPreparation:
    """What CapacityGate.prepare starts ahead of the gate's turn; run takes each piece it uses (leaving None), and
    release stops the rest."""

    server: AbstractContextManager[Any] | None = None
    """The candidate's own server, launched (a `with` block over it benches it and stops it)."""
    probe: ContentionProbe | None = None
    """The contention probe of a server benched alone here."""
    baseline: AbstractContextManager[Any] | None = None
    """The baseline's own server, launched, for a change benched interleaved."""

    def stop(self) -> None:
        """Stop every piece not taken."""
        for piece in (self.server, self.probe, self.baseline):
            stop = getattr(piece, "stop", None)
            if callable(stop):
                stop()
        self.server = self.probe = self.baseline = None


@register_gate(
    "capacity",
    watches=GATE_WATCHES["capacity"],
    purpose="the declared latency, throughput and memory targets hold under the declared workload",
)
class CapacityGate(Gate):
    """Bench at the declared workload; fail on any missed target."""

    # a staticmethod, so that a test's substitute is not bound to the gate
    server_factory: ClassVar[staticmethod[[ServedModel], AbstractContextManager[Any]]] = staticmethod(own_server)
    """Starts the server to bench (tests substitute one with known delays)."""

    def __init__(self) -> None:
        self.prepared = CapacityPreparation()
        """What prepare started for run (tests set its pieces to bench servers of their own)."""

    def prepare(self, ctx: GateContext) -> None:
        """Launch the candidate's own server now, so its start-up (seconds of imports and loading) overlaps
        the gates that run before this one."""
        served = ctx.candidate
        ours = type(self).server_factory is own_server  # tests substitute servers of their own
        if ours and served.capacity.targets is not None and served.capacity.workload is not None:
            if not served.runtime.remote:
                from servegate.capacity.bench.local_server import LocalServer

                self.prepared.server = LocalServer(served).launch()
                if not paired_mode(ctx.mode, ctx.baseline, served):  # torch's import overlaps the other gates
                    self.prepared.probe = _probe(served)
                if paired_mode(ctx.mode, ctx.baseline, served) and not ctx.baseline.runtime.remote:
                    self.prepared.baseline = LocalServer(ctx.baseline).launch()

    def release(self) -> None:
        """Stop the servers and probe prepared and not benched."""
        self.prepared.stop()

    def run(self, ctx: GateContext) -> GateResult:
        """Bench the candidate and compare each declared target with what was measured."""
        served = ctx.candidate
        targets, workload = served.capacity.targets, served.capacity.workload
        if targets is None:
            return self.result("skipped", "no capacity.targets declared")
        if workload is None:
            return self.result("fail", "capacity.targets are declared but capacity.workload is not: declare the load")
        memory = _memory(served) if targets.memory is not None and not served.runtime.remote else None
        paired = paired_mode(ctx.mode, ctx.baseline, served)
        total = workload.num_requests * (2 if paired else 1)
        label = f"capacity: {total} requests" + (" (baseline and candidate interleaved)" if paired else "")
        ctx.progress.start(label, total)  # shown while the server starts; the bench restarts it
        prepared, self.prepared.server = self.prepared.server, None
        if prepared is None and served.runtime.starts_vllm and type(self).server_factory is own_server:
            prepared = _RunningVllm(ctx.engines.get(served))  # the vLLM the other gates use, started once
        server = prepared if prepared is not None else self.server_factory(served)
        own_note = getattr(server, "memory_note", None)
        # a server that runs here shares this machine's cores: a miss counts only when they held (capacity_machine.py)
        here = not served.runtime.remote and not paired
        probe: ContentionProbe | None = None
        if here:
            probe, self.prepared.probe = self.prepared.probe or _probe(served), None
        change = control = contention = None
        try:
            with ctx.split.phase("bench"), server as running:  # a server started here: its start-up is the bench's
                if paired:
                    change = self._bench_change(running.url, ctx)
                    result = change.candidate
                else:
                    result, contention = _bench_alone(served, running, probe, ctx.progress, label)
                report = result.as_dict()
                peak = peak_memory(running)
                verdict, peak, note, unchecked = self._judge(ctx, report, result, (peak, own_note), memory, change)
                if here and has_excusable_miss(verdict):
                    verdict, control = self._unless_moved(ctx, verdict, report, contention, running.url, probe)
        finally:
            if probe is not None:
                probe.stop()
        measurements = CapacityMeasurements(
            **{k: report[k] for k in ("ttft_ms", "tpot_ms", "e2el_ms", "throughput", "goodput", "requests")},
            targets=verdict.checks,
            memory_total_bytes=memory.total_bytes if memory is not None else None,
            peak_memory_bytes=peak,
            machine_speed=report.get("machine_speed"),
            client_limited=report.get("client_limited"),
            load_average=report.get("load_average"),
            paired=paired,
            contention=contention.as_dict() if contention is not None else None,
            control=control.as_dict() if control is not None else None,
        )
        if report["requests"]["completed"] == 0:
            if served.runtime.remote:
                where = served.runtime.endpoint_url
                return self.result("unavailable", f"no request to {where} completed", measurements)
            return self.result("fail", "no request of the bench completed", measurements)
        if unchecked:
            measurements = measurements.updated(memory_unchecked=unchecked)
        if verdict.verdict != "pass":
            also = f"; {unchecked}" if unchecked else ""
            excused = any(c.get("machine_moved") for c in verdict.checks)  # the machine's moves said there already
            unsteady = "" if excused else _unsteady(report)
            return self.result(verdict.verdict, verdict.reason + also + unsteady, measurements)
        how = "against the baseline, interleaved, and " if paired else ""
        met = f"{len(verdict.checks)} target(s) met {how}at {_load(workload)}"
        if unchecked:
            return self.result("warn", f"{met}; {unchecked}", measurements)
        return self.result("pass", met + (f" ({note})" if note else ""), measurements)

    def _judge(
        self,
        ctx: GateContext,
        report: dict[str, Any],
        result: Any,
        measured: tuple[int | None, str | None],
        memory: Any,
        change: Any,
    ) -> tuple[CapacityVerdict, int | None, str, str]:
        """Every target against the bench (`measured`: the server's peak memory and its own note on it): the
        verdict, the peak memory, the memory note and why memory was not checked ('' when it was)."""
        served, targets = ctx.candidate, ctx.candidate.capacity.targets
        assert targets is not None  # run() skips the gate without them
        peak, own_note = measured
        # memory: the server this gate ran, its whole process (interpreter, torch, both engines) as an operator
        # sees it; a remote's own report of its whole deployment; unchecked otherwise
        note, unchecked, memory_bytes = "", "", peak
        if targets.memory is not None and peak is None and served.runtime.remote:
            peak, note = _remote_memory(served, ctx.remote)
            memory_bytes = peak
            unchecked = "" if peak is not None else f"memory target not checked: {note}"
        if targets.memory is not None and not note:
            if peak is not None:
                note = own_note or "memory: peak resident memory of the server process"
            elif memory is not None:  # a substituted server (tests): the plan, said as such
                memory_bytes = memory.total_bytes
                note = "memory: planned (weights, KV pool, runtime estimate), not measured"
            else:
                unchecked = "memory target not checked: the model config could not be read"
        checks = check_targets(targets, report, memory_bytes)
        records = [r for run in result.runs for r in run.records]
        # a server here has its machine judged in capacity_machine.py; a remote's misses on an oversubscribed client
        # machine are warnings here
        load = None if not served.runtime.remote and change is None else report.get("load_average")
        verdict = judge(targets, records, checks, change, describe_miss=_miss, load=load)
        return verdict, peak, note, unchecked

    def _unless_moved(
        self,
        ctx: GateContext,
        verdict: CapacityVerdict,
        report: dict[str, Any],
        contention: Contention | None,
        candidate_url: str,
        probe: ContentionProbe | None,
    ) -> tuple[CapacityVerdict, Control | None]:
        """A miss of a server benched here: excused when the machine moved during the bench; else measured again,
        interleaved with the reference form, and excused when the machine moved then (capacity_machine.py)."""
        reasons = machine_reasons(report, contention)
        if reasons:
            return excuse(verdict, reasons), None
        if ctx.baseline.runtime.remote:
            return verdict, None
        control = self._control(ctx, candidate_url, probe)
        if control.reasons:
            return excuse(verdict, control.reasons), control
        return CapacityVerdict(verdict.verdict, verdict.reason + held_note(control), verdict.checks), control

    def _control(self, ctx: GateContext, candidate_url: str, probe: ContentionProbe | None) -> Control:
        """The reference form's server started beside the candidate's, both benched interleaved."""
        served, reference = ctx.candidate, ctx.baseline
        targets, workload = served.capacity.targets, served.capacity.workload
        assert workload is not None  # run() fails the gate without it
        total = 2 * workload.num_requests
        ctx.progress.start(f"capacity: {total} requests (the reference form interleaved: did the machine hold?)", total)
        runs, began, ended = self._bench_beside(ctx, reference, candidate_url)
        side = as_bench_result(runs, served.capacity.workload, slo_from_targets(targets), candidate_url)
        second = judge(targets, runs.pooled("candidate"), check_targets(targets, side.as_dict(), None))
        seen = judge_contention(probe.samples_between(began, ended), probe.threads) if probe is not None else None
        return judge_control(runs, second.verdict, seen)

    def _bench_change(self, candidate_url: str, ctx: GateContext) -> Any:
        """A change: the baseline's server started beside the candidate's and both benched interleaved."""
        served = ctx.candidate
        prepared, self.prepared.baseline = self.prepared.baseline, None
        runs, _, _ = self._bench_beside(ctx, ctx.baseline, candidate_url, prepared)
        return bench_change_sides(runs, served, slo_from_targets(served.capacity.targets), candidate_url)

    def _bench_beside(
        self, ctx: GateContext, other: ServedModel, candidate_url: str, prepared: Any = None
    ) -> tuple[InterleavedRuns, float, float]:
        """`other`'s server (`prepared`, else started) beside the candidate's, both benched interleaved with the
        same prompts: the runs, and the wall-clock times (time.time()) the bench began and ended."""
        served = ctx.candidate
        prompts = PromptFactory(manifest_tokenizer(served) if not served.runtime.external else None)
        with prepared if prepared is not None else self.server_factory(other) as other_server:
            began = time.time()
            runs = asyncio.run(
                bench_interleaved(other_server.url, candidate_url, other, served, prompts, ctx.progress.advance)
            )
            return runs, began, time.time()


def _miss(check: TargetCheck) -> str:
    d = check.as_dict()
    if check.unit == "bytes":
        from servegate.contracts.units import format_bytes

        got, want, by = (format_bytes(int(x)) for x in (check.predicted, check.target, d["missed_by"]))
    else:
        got, want, by = (f"{x:.4g} {check.unit}" for x in (check.predicted, check.target, d["missed_by"]))
    return f"{check.name} measured {got} against {want} (missed by {by}, {d['missed_by_pct']:.1f}%)"


def _unsteady(report: dict[str, Any]) -> str:
    """A warning for a miss measured while this machine's speed moved (machine_speed.py), else nothing."""
    from servegate.capacity.bench.machine_speed import MachineSpeed

    if not report.get("machine_speed"):
        return ""
    speed = MachineSpeed.from_dict(report["machine_speed"])
    if speed.steady:
        return ""
    return (
        f" (this machine's speed moved by {speed.spread:.2f}x during the bench: other work on its cores may "
        "have caused the miss; run the gate again on a steady machine)"
    )


def _load(workload: Any) -> str:
    if workload.arrival == "closed":
        return f"{workload.concurrency} requests in flight"
    return f"{workload.rate_rps:g} requests/s ({workload.arrival})"


def _probe(served: ServedModel) -> ContentionProbe:
    """The contention probe for the server's torch team (runtime.threads, else the runtime's default), launched."""
    from servegate.runtime.model.cpu_linear import default_threads

    return ContentionProbe(served.runtime.threads or default_threads()).launch()


def _bench_alone(
    served: ServedModel, running: Any, probe: ContentionProbe | None, progress: Any, label: str
) -> tuple[Any, Contention | None]:
    """The declared workload against the running server, with what the probe and the server's own threads'
    run-queue wait said about its cores meanwhile (None when nothing was probed)."""
    pid = getattr(running, "pid", None)
    before = run_queue_times(pid) if pid else None
    if probe is not None:
        probe.begin()
    began = time.time()
    workload = served.capacity.workload
    assert workload is not None  # CapacityGate.run() fails the gate without it
    result = bench_url(
        running.url,
        workload,
        served=served,
        tokenizer=manifest_tokenizer(served) if not served.runtime.external else None,
        slo=slo_from_targets(served.capacity.targets),
        progress=progress,
        label=label,
    )
    if probe is None:
        return result, None
    wait = wait_share_between(before, run_queue_times(pid) if pid else None)
    return result, judge_contention(probe.samples_between(began, time.time()), probe.threads, wait)
