"""The load generator: open-loop (Poisson or gamma) or closed-loop arrivals, rate sweeps, repeated runs.

Open loop: every request has a scheduled send time drawn from the arrival process before the run starts,
and its latencies count from that time, so when the server (or the client) falls behind, the queueing
shows in the figures instead of silently slowing the arrivals (no coordinated omission). Closed loop:
`concurrency` workers each send the next request as soon as their previous one finished.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from servegate.capacity.bench.checks import (
    client_checks,
    client_warning,
    failure_sentence,
    failures,
    shape_warnings,
    workload_shape,
)
from servegate.capacity.bench.machine_speed import MachineSpeed, MachineSpeedMonitor, usable_cores
from servegate.capacity.bench.prompt_file import FilePrompt, with_prompts
from servegate.capacity.bench.run_metrics import DEFINITIONS, SLO, RequestRecord, summarize
from servegate.capacity.bench.targets import BenchTarget, PromptFactory
from servegate.capacity.bench.workload import RequestSpec, make_requests, with_rate
from servegate.contracts.capacity_section import Workload

Progress = Callable[[int], None]
"""Called with the number of requests just completed (1), to drive a progress bar."""

_SPIN_S = 0.0015
"""The last stretch before a scheduled send is spun, not slept: epoll wakes late by up to 1 ms. Not for
targets in this process (EngineTarget): spinning there takes the interpreter lock from the engine."""


@dataclass
class BenchRun:
    """The records of one run and its summary."""

    records: list[RequestRecord]
    summary: dict[str, Any]
    rate_rps: float | None
    """Offered rate (open loop), requests/s."""
    concurrency: int | None
    """Workers (closed loop)."""
    began_at: float = 0.0
    """Wall-clock time (time.time()) the run started."""
    ended_at: float = 0.0
    """Wall-clock time its last request ended."""
    machine_speed: MachineSpeed | None = None
    """How fast this machine ran meanwhile (machine_speed.py), when it was monitored."""


@dataclass
class BenchResult:
    """All runs of a bench: repeats at one load, or one run per rate of a sweep."""

    workload: Workload
    runs: list[BenchRun] = field(default_factory=list)
    slo: SLO = field(default_factory=SLO)
    target: str = ""
    machine_speed: MachineSpeed | None = None
    """How fast this machine ran over all the runs, when it was monitored."""
    ignore_eos: bool = False
    """Whether requests asked the server to run every output to max_tokens."""
    exact_prompts: bool = False
    """Whether prompts were cut to exact token counts by a tokenizer (else about 4 characters per token)."""
    max_error_share: float = 0.0
    """The share of failed requests the bench tolerates before it fails."""
    load_average: tuple[float, float] | None = None
    """This machine's 1-minute load average when the bench began and when it ended."""

    def as_dict(self) -> dict[str, Any]:
        """The JSON report: pooled figures at the top, per-run figures, the interval across repeats, and what the
        bench checked about itself (failures, the workload's shape, the client) with a warning for each miss."""
        records = [r for run in self.runs for r in run.records]
        if len(self.runs) == 1:  # one run: its own summary (the paired gate's holds its rounds' throughput)
            pooled = self.runs[0].summary
        else:
            pooled = summarize(records, self.slo, intervals=True) if self.runs else {}
        if len({run.rate_rps for run in self.runs}) > 1:  # a sweep: pooling different loads means nothing
            pooled = self.runs[-1].summary
        out: dict[str, Any] = {
            "target": self.target,
            "definitions": DEFINITIONS,
            "workload": self.workload.model_dump(mode="json"),
            **{k: pooled.get(k) for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "throughput", "goodput")},
            "requests": pooled.get("requests"),
            "dispatch_delay_ms": pooled.get("dispatch_delay_ms"),
            "runs": [_run_dict(run) for run in self.runs],
        }
        out.update(self._checks(records, out["runs"]))
        if self.load_average is not None:
            out["load_average"] = load = load_average_dict(*self.load_average)
            if load["oversubscribed"]:
                out["warnings"].append(
                    f"this machine was oversubscribed (load average {max(load['before'], load['after']):.1f} on "
                    f"{load['cpus']} CPUs): other work shared the cores with the server and the client"
                )
        if self.machine_speed is not None:
            out["machine_speed"] = self.machine_speed.as_dict()
        if len(self.runs) > 1 and out["runs"] and len({run.rate_rps for run in self.runs}) == 1:
            out["across_runs"] = across_runs([run.summary for run in self.runs])
        return out

    def _checks(self, records: list[RequestRecord], runs: list[dict[str, Any]]) -> dict[str, Any]:
        """Failures, the workload's shape and the client's own delay (bench_checks.py), with their warnings."""
        errors = failures(records, self.max_error_share)
        shape = workload_shape(records, ignore_eos=self.ignore_eos, exact_prompts=self.exact_prompts)
        limited = [run["client"] for run in runs if run["client"]["client_limited"]]
        client = limited[0] if limited else (runs[-1]["client"] if runs else {})
        warnings = [failure_sentence(errors)] if errors["failed"] else []
        warnings += shape_warnings(shape, f"the server at {self.target}" if self.target else "the server")
        if limited:
            warnings.append(f"{len(limited)} of {len(runs)} run(s) " + (client_warning(client) or ""))
        return {
            "errors": errors,
            "workload_shape": shape,
            "client": client,
            "client_limited": bool(limited),
            "warnings": warnings,
        }


OVERSUBSCRIBED_EXTRA = 2.0
"""Runnable processes beyond one per CPU that the bench and a local server under test account for themselves."""


def load_average_dict(before: float, after: float) -> dict[str, Any]:
    """The load averages, the CPUs this process may use, and whether the machine was oversubscribed: more
    runnable processes than its CPUs plus the bench's own (then other work shares the cores with the server)."""
    cpus = usable_cores()
    peak = max(before, after)
    return {"before": before, "after": after, "cpus": cpus, "oversubscribed": peak > cpus + OVERSUBSCRIBED_EXTRA}


def records_jsonl(result: BenchResult) -> str:
    """One JSON line per request of every run: its dispatch delay, latencies (ms), tokens asked and reported, error."""
    import json

    def ms(value: float | None) -> float | None:
        return None if value is None else 1000.0 * value

    lines = []
    for i, run in enumerate(result.runs):
        for r in run.records:
            line: dict[str, object] = {"run": i, "ok": r.ok, "dispatch_delay_ms": ms(r.dispatch_delay)}
            line.update(ttft_ms=ms(r.ttft) if r.ok else None, tpot_ms=ms(r.tpot) if r.ok else None)
            line.update(e2el_ms=ms(r.e2el) if r.ok else None, error=r.error, chunks=r.chunks)
            line.update(requested_prompt_tokens=r.requested_prompt_tokens, usage_prompt_tokens=r.usage_prompt_tokens)
            line.update(requested_output_tokens=r.requested_output_tokens, usage_output_tokens=r.usage_output_tokens)
            lines.append(json.dumps(line) + "\n")
    return "".join(lines)


def _run_dict(run: BenchRun) -> dict[str, Any]:
    out = {"rate_rps": run.rate_rps, "concurrency": run.concurrency, **run.summary}
    out["client"] = client_checks(run.records, run.summary)
    if run.machine_speed is not None:
        out["machine_speed"] = run.machine_speed.as_dict()
    return out


def across_runs(summaries: Sequence[dict[str, Any]], confidence: float = 0.95) -> dict[str, Any]:
    """Mean and Student-t interval across repeated runs for each latency percentile and throughput."""
    from scipy import stats

    def interval(values: list[float]) -> dict[str, float]:
        n = len(values)
        mean = sum(values) / n
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n) if n > 1 and sd > 0 else 0.0
        # every figure here is a latency or a rate: an interval below zero says only "few runs", so it stops at 0
        return {"mean": mean, "low": max(mean - half, 0.0), "high": mean + half, "runs": n}

    out: dict[str, Any] = {"confidence": confidence}
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        out[metric] = {p: interval([s[metric][p] for s in summaries]) for p in ("mean", "p50", "p95", "p99")}
    out["throughput"] = {
        k: interval([s["throughput"][k] for s in summaries]) for k in ("requests_per_s", "output_tokens_per_s")
    }
    return out


async def _sleep_until(deadline: float, spin_s: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > spin_s:
        await asyncio.sleep(delay - spin_s)
    while time.perf_counter() < deadline:
        await asyncio.sleep(0)


def _text(spec: RequestSpec, prompts: PromptFactory) -> str:
    """The spec's own prompt (from a prompt file), else a fresh one of its length."""
    return spec.text if spec.text is not None else prompts.text(spec.prompt_tokens)


async def run_open_loop(
    target: BenchTarget, specs: Sequence[RequestSpec], prompts: PromptFactory, progress: Progress | None = None
) -> list[RequestRecord]:
    """Send each request at its scheduled offset, whatever state earlier requests are in."""
    records: list[RequestRecord] = []
    tasks: list[asyncio.Task[None]] = []

    async def one(spec: RequestSpec, prompt: str, record: RequestRecord) -> None:
        await target.send(spec, prompt, record)
        if progress:
            progress(1)

    texts = [_text(spec, prompts) for spec in specs]  # built before the clock starts
    spin = 0.0 if getattr(target, "in_process", False) else _SPIN_S
    start = time.perf_counter() + 0.005
    for spec, prompt in zip(specs, texts, strict=True):
        assert spec.arrival_s is not None, "open-loop requests need scheduled arrivals"
        record = RequestRecord(scheduled=start + spec.arrival_s, prompt_tokens=spec.prompt_tokens)
        records.append(record)
        await _sleep_until(record.scheduled, spin)
        tasks.append(asyncio.create_task(one(spec, prompt, record)))
    await asyncio.gather(*tasks)
    return records


async def run_closed_loop(
    target: BenchTarget,
    specs: Sequence[RequestSpec],
    prompts: PromptFactory,
    concurrency: int,
    progress: Progress | None = None,
) -> list[RequestRecord]:
    """`concurrency` workers, each sending its next request as soon as the previous one finished."""
    queue = [(spec, _text(spec, prompts)) for spec in reversed(specs)]
    records: list[RequestRecord] = []

    async def worker() -> None:
        while queue:
            spec, prompt = queue.pop()
            record = RequestRecord(scheduled=time.perf_counter(), prompt_tokens=spec.prompt_tokens)
            records.append(record)
            await target.send(spec, prompt, record)
            if progress:
                progress(1)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


async def run_once(
    target: BenchTarget,
    workload: Workload,
    prompts: PromptFactory,
    seed: int = 0,
    slo: SLO | None = None,
    prompt_lengths: Sequence[int] | None = None,
    progress: Progress | None = None,
    prompt_file: Sequence[FilePrompt] | None = None,
) -> BenchRun:
    """One run of `workload.num_requests` requests (sending `prompt_file`'s prompts in order, when given)."""
    specs = make_requests(workload, seed, prompt_lengths=prompt_lengths)
    if prompt_file is not None:
        specs = with_prompts(specs, prompt_file)
    began = time.time()
    if workload.arrival == "closed":
        assert workload.concurrency is not None
        records = await run_closed_loop(target, specs, prompts, workload.concurrency, progress)
    else:
        records = await run_open_loop(target, specs, prompts, progress)
    summary = summarize(records, slo, intervals=True)
    return BenchRun(records, summary, workload.rate_rps, workload.concurrency, began_at=began, ended_at=time.time())


async def run_bench(
    target: BenchTarget,
    workload: Workload,
    prompts: PromptFactory,
    *,
    repeats: int = 1,
    rates: Sequence[float] | None = None,
    slo: SLO | None = None,
    seed: int = 0,
    prompt_lengths: Sequence[int] | None = None,
    progress: Progress | None = None,
    target_name: str = "",
    monitor_machine: bool = True,
    prompt_file: Sequence[FilePrompt] | None = None,
) -> BenchResult:
    """Repeated runs at the workload's load, or one run per rate of a sweep (then repeats per rate).

    With `monitor_machine`, this machine's speed is sampled throughout (machine_speed.py) and reported for
    the whole bench and for each run: the client's machine, and the server's too when it runs here.
    """
    result = BenchResult(workload, slo=slo or SLO(), target=target_name)
    result.ignore_eos = bool(getattr(target, "ignore_eos", False))
    result.exact_prompts = getattr(prompts, "tokenizer", None) is not None
    loads = [with_rate(workload, r) for r in rates] if rates else [workload]
    monitor = MachineSpeedMonitor() if monitor_machine else None
    before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with monitor or nullcontext():
        for load in loads:
            for i in range(repeats):
                one = await run_once(target, load, prompts, seed + i, slo, prompt_lengths, progress, prompt_file)
                result.runs.append(one)
    if before is not None:
        result.load_average = (before, os.getloadavg()[0])
    if monitor is not None:
        result.machine_speed = monitor.summary()
        for run in result.runs:
            run.machine_speed = monitor.summary(run.began_at, run.ended_at)
    return result
