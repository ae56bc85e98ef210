"""`gate check --jobs`: gates that time nothing run in worker processes beside the check's own.

A gate registered `beside_others` compares outputs and behaviour, never how fast they came: a busier machine
cannot change its verdict, so it may run while other gates run. The others (the capacity gate's bench, the
caching gate's timing audits, and every gate that does not say) run alone, in the check's own process, after
the gates beside each other have all ended. Gates that reuse each other's outputs (`shares`: the evaluation
baseline's suite runs) run in one process, so no output is generated twice.

Processes, not threads: a small model's decode steps are Python-bound and would wait on one interpreter lock.
Each worker is a fresh interpreter (`spawn`: a fork would copy torch's thread pools mid-use) that imports
servegate, loads the suites and its own engines, and sends back its gates' results and time split.

`auto` takes as many processes as the cores hold engines at their declared threads (`runtime.threads`, else
the runtime's default: half the cores) and the memory holds the models, at most one per group of gates; it keeps
one for models too small to pay for a worker's start-up, and `--jobs N` too when an engine is a server (vLLM,
llama.cpp, an endpoint: the check's pool shares one server), on a GPU, or with engines from another factory.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue as queue_module
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from servegate.capacity.bench.machine_speed import usable_cores
from servegate.contracts.loading import load_fallback
from servegate.contracts.manifest import ServedModel
from servegate.gates.base import CheckResources, EnginePool, GateContext, ProgressHook, quiet_libraries
from servegate.gates.registry import GATES
from servegate.gates.result import GateResult
from servegate.gates.run_gates import PlannedGate, run_planned
from servegate.gates.suites.output_cache import OutputCache
from servegate.gates.time_split import SETUP, TimeSplit, worker_setup
from servegate.runtime.import_noise import silence_import_noise

Jobs = int | Literal["auto"]
"""How many processes `gate check` runs gates in: a number, or `auto` (see the module doc)."""

GIB = 1024**3
PROCESS_FLOOR_BYTES = int(1.5 * GIB)
"""A check's process before its models: torch, transformers, the suites and an engine's workspace (the quickstart's
check peaked at 1.9 GiB resident with models of a few MiB; 2026-12-06, Intel Xeon and AMD EPYC VMs)."""
WEIGHT_COPIES = 6
"""Resident copies of a model's weight files a process may hold at once: the engine's and the divergence probe's
copy of each side, widened to float32 where the files are narrower. Deliberately generous: a worker that runs out
of memory costs its gates' verdicts."""

AUTO_MIN_WEIGHT_BYTES = 64 * 1024**2
"""`auto` keeps one process for models whose weight files total less: their gates take seconds, and a worker's
start-up (importing torch and transformers, loading the suites and its engines: 5-7 s on 2 cores, while the
capacity gate's server starts beside it) costs more than it saves. The quickstart (4 MiB) took 26.0 s in 2
processes against 19.0 s in one (2026-12-06, AMD EPYC VM, 2 cores, warm baseline cache)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Schedule:
    """Which process runs which gates."""

    groups: tuple[tuple[str, ...], ...]
    """The gates each process runs beside the others: the first is the check's own process, each other a worker."""
    alone: tuple[str, ...]
    """Gates that run in the check's own process after every group has ended."""
    reason: str
    """Why this many processes (cores, threads, memory, or what kept the check to one)."""

    @property
    def jobs(self) -> int:
        """Processes that run gates at once."""
        return max(1, len(self.groups))

    def note(self) -> str:
        """The report's line on how the gates ran."""
        if self.jobs == 1:
            return ""
        where = "; ".join(f"process {i + 1}: {', '.join(g)}" for i, g in enumerate(self.groups))
        after = f"; then alone: {', '.join(self.alone)}" if self.alone else ""
        return f"gates ran in {self.jobs} processes ({self.reason}): {where}{after}"


def schedule(
    planned: Sequence[PlannedGate],
    manifests: Sequence[ServedModel],
    jobs: Jobs,
    *,
    own_engines: bool = True,
    cores: int | None = None,
    available_bytes: int | None = None,
) -> Schedule:
    """Split the gates that run into processes: `jobs` of them at most (`auto`: as many as fit), one when a manifest
    runs on a server or a GPU or the engines are a caller's own (`own_engines` False)."""
    running = [p.name for p in planned if p.run]
    units = _units(running)
    alone = tuple(n for n in running if not any(n in u for u in units))
    one_process = Schedule((tuple(n for u in units for n in u),) if units else (), alone, "")
    if jobs == 1:
        return replace(one_process, reason="--jobs 1")
    if len(units) < 2:
        return replace(one_process, reason="fewer than two groups of gates can run beside each other")
    kept = _kept_to_one(manifests, own_engines)
    if kept:
        return replace(one_process, reason=kept)
    if jobs == "auto":
        count, reason = _auto(manifests, len(units), cores, available_bytes)
    else:
        count, reason = min(jobs, len(units)), f"--jobs {jobs}"
    if count < 2:
        return replace(one_process, reason=reason)
    groups: list[list[str]] = [[] for _ in range(count)]
    for i, unit in enumerate(units):  # in the gates' order, round robin: the check's own process starts first
        groups[i % count].extend(unit)
    return Schedule(tuple(tuple(g) for g in groups), alone, reason)


def _units(running: Sequence[str]) -> list[tuple[str, ...]]:
    """The gates that may run beside others, grouped by what they share, in the order they run."""
    units: dict[str, list[str]] = {}
    for name in running:
        metadata = GATES.entry(name).metadata
        if metadata.get("beside_others"):
            units.setdefault(metadata.get("shares") or name, []).append(name)
    return [tuple(u) for u in units.values()]


def _kept_to_one(manifests: Sequence[ServedModel], own_engines: bool) -> str:
    """Why the gates must share one process ('' when they need not)."""
    if not own_engines:
        return "the engines come from a factory other than the runtime's"
    if any(m.runtime.remote for m in manifests):
        return "an engine is a server, which the check's one process shares between gates"
    if any(_on_gpu(m) for m in manifests):
        return "the models run on a GPU, which one process uses whole"
    return ""


def _on_gpu(served: ServedModel) -> bool:
    if served.runtime.device == "cpu":
        return False
    import torch

    return served.runtime.device == "cuda" or torch.cuda.is_available()


def _auto(
    manifests: Sequence[ServedModel], units: int, cores: int | None, available_bytes: int | None
) -> tuple[int, str]:
    """(processes, why): what the cores hold at the engines' threads and the memory at the models' size."""
    from servegate.runtime.model.cpu_linear import default_threads

    cores = cores or usable_cores()
    threads = max(m.runtime.threads or default_threads() for m in manifests)
    by_cores = max(1, cores // threads)
    available = available_bytes if available_bytes is not None else memory_available()
    weights = weights_bytes(manifests)
    if available is None or weights is None:
        what = "available memory" if available is None else "the models' size"
        return 1, f"auto: {what} unknown"
    if weights < AUTO_MIN_WEIGHT_BYTES:
        return 1, f"auto: {weights / 1024**2:.0f} MiB of weights, too little work to pay for a worker's start-up"
    need = PROCESS_FLOOR_BYTES + WEIGHT_COPIES * weights
    by_memory = max(1, available // need)
    count = min(units, by_cores, by_memory)
    return count, (
        f"auto: {cores} cores at {threads} thread(s) per engine, {available / GIB:.1f} GiB available at about "
        f"{need / GIB:.1f} GiB a process"
    )


def memory_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable in bytes, or None where the kernel does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def weights_bytes(manifests: Sequence[ServedModel]) -> int | None:
    """The weight files of every model the gates may load (the manifests', their fallbacks'), in bytes; None when
    a model's files are not on this machine yet (a hub download). A process may need WEIGHT_COPIES of them."""
    models: dict[str, ServedModel] = {}
    for served in manifests:
        for model in (served, load_fallback(served)):
            if model is not None:
                models.setdefault(model.weights.source, model)
    total = 0
    for model in models.values():
        size = _weights_bytes(model)
        if size is None:
            return None
        total += size
    return total


def _weights_bytes(served: ServedModel) -> int | None:
    if served.weights.source.startswith("hf:"):
        return None  # sizing must not download it
    from servegate.runtime.model.weights import resolve_weights_dir

    try:
        folder = resolve_weights_dir(served)
    except Exception:  # noqa: BLE001 - an unresolvable source fails later with its own message; here: unknown
        return None
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# --- running the schedule ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerTask:
    """What a worker process needs to run its gates as the check's own process would."""

    process: int
    baseline: ServedModel
    candidate: ServedModel
    reference: ServedModel | None
    mode: Literal["reference", "change"]
    planned: tuple[PlannedGate, ...]
    cache_dir: Path
    cache_enabled: bool


@dataclass
class WorkerOutcome:
    """What a worker sends back: its gates' results, its time split and its use of the baseline cache."""

    results: list[GateResult]
    split: dict[str, dict[str, float]]
    cache_counts: tuple[int, int, int] = (0, 0, 0)
    """(hits, misses, rejected) of the baseline cache."""


@dataclass
class Ran:
    """The results of a scheduled check, with which process ran each gate and what the workers measured."""

    results: list[GateResult]
    processes: dict[str, int] = field(default_factory=dict)
    """Gate -> the process that ran it (1: the check's own), for the gates a worker ran."""
    splits: dict[str, dict[str, float]] = field(default_factory=dict)
    """The workers' time-split rows: their gates', and each worker's own setup as `setup (process N)`."""


_PROGRESS: Any = None
"""A worker's queue back to the check's progress display (set by `_start_worker`)."""


class _QueueProgress(ProgressHook):
    """A worker's progress hook: each call goes to the check's process, which shows it in the worker's lane."""

    def __init__(self, process: int) -> None:
        self.process = process

    def start(self, description: str, total: int) -> None:
        """Send a new piece of work."""
        _send((self.process, "start", description, total))

    def advance(self, steps: int = 1) -> None:
        """Send steps done."""
        _send((self.process, "advance", steps))


def _send(message: tuple[Any, ...]) -> None:
    if _PROGRESS is not None:
        _PROGRESS.put(message)


def _start_worker(progress: Any) -> None:
    """A worker's start: keep the progress queue, and keep libraries' bars and warnings out of the check's output."""
    global _PROGRESS
    _PROGRESS = progress
    silence_import_noise()
    quiet_libraries()


def work(task: WorkerTask) -> WorkerOutcome:
    """Run a worker's gates (in the worker process) on engines and suites of its own."""
    cache = OutputCache(task.cache_dir, enabled=task.cache_enabled)
    split = TimeSplit()
    pool = EnginePool()
    ctx = GateContext(
        task.baseline,
        task.candidate,
        task.mode,
        reference=task.reference,
        progress=_QueueProgress(task.process),
        resources=CheckResources(engines=pool, cache=cache, split=split),
    )
    ctx.suites()
    results = run_planned(ctx, task.planned, pool)
    return WorkerOutcome(results, split.as_dict(), (cache.hits, cache.misses, cache.rejected))


def run_scheduled(
    ctx: GateContext,
    planned: Sequence[PlannedGate],
    pool: EnginePool,
    plan: Schedule,
    worker: Callable[[WorkerTask], WorkerOutcome] = work,
) -> Ran:
    """Run the planned gates as scheduled: the first group here while the workers run `worker` on theirs, then the
    gates that run alone; skipped gates say why. A worker that dies fails its gates; a bug in a gate propagates."""
    if plan.jobs == 1:
        return Ran(run_planned(ctx, planned, pool))
    by_name = {p.name: p for p in planned}
    elsewhere = {name: i + 2 for i, group in enumerate(plan.groups[1:]) for name in group}
    here = [p for p in planned if p.name not in elsewhere and p.name not in plan.alone]
    here += [by_name[name] for name in plan.alone]
    context = multiprocessing.get_context("spawn")
    progress = context.Queue()
    relay = _Relay(progress, ctx.progress)
    futures: dict[int, Future[WorkerOutcome]] = {}
    with ExitStack() as workers:  # an executor per worker: one that dies breaks only its own pool, and its gates
        for i, group in enumerate(plan.groups[1:]):
            task = WorkerTask(
                i + 2, ctx.baseline, ctx.candidate, ctx.reference, ctx.mode, tuple(by_name[n] for n in group),
                ctx.resources.cache.directory, ctx.resources.cache.enabled,
            )  # fmt: skip
            executor = ProcessPoolExecutor(1, mp_context=context, initializer=_start_worker, initargs=(progress,))
            futures[i + 2] = workers.enter_context(executor).submit(worker, task)
        outcomes: dict[int, WorkerOutcome | BaseException] = {}
        try:
            results = run_planned(
                ctx, here, pool, before=set(plan.alone), wait=lambda: outcomes.update(_collect(futures))
            )
        finally:
            relay.stop()
    ran = Ran(results, processes=elsewhere)
    for number, outcome in sorted(outcomes.items()):
        group = plan.groups[number - 1]
        if isinstance(outcome, BaseException):
            ran.results += [_died(by_name[name], outcome) for name in group]
            continue
        ran.results += outcome.results
        for row, kinds in outcome.split.items():
            ran.splits[worker_setup(number) if row == SETUP else row] = kinds
        hits, misses, rejected = outcome.cache_counts
        cache = ctx.resources.cache
        cache.hits, cache.misses, cache.rejected = cache.hits + hits, cache.misses + misses, cache.rejected + rejected
    order = [p.name for p in planned]
    ran.results.sort(key=lambda r: order.index(r.name))
    return ran


def _collect(futures: dict[int, Future[WorkerOutcome]]) -> dict[int, WorkerOutcome | BaseException]:
    """Wait for every worker: its outcome, or why it died (a bug in a gate is raised here, as in one process)."""
    collected: dict[int, WorkerOutcome | BaseException] = {}
    for number, future in futures.items():
        try:
            collected[number] = future.result()
        except BrokenProcessPool as exc:
            collected[number] = exc
    return collected


def _died(plan: PlannedGate, exc: BaseException) -> GateResult:
    """The result of a gate whose worker process ended before it answered (killed, out of memory)."""
    reason = f"could not run: its worker process ended before it answered ({type(exc).__name__}: {exc})"
    return GateResult(plan.name, "fail", reason, triggered_by=[plan.why])


class _Relay:
    """Shows the workers' progress: a thread reads their queue into a lane of the check's display per worker."""

    def __init__(self, source: Any, hook: ProgressHook) -> None:
        self.source = source
        self.hook = hook
        self.lanes: dict[int, ProgressHook] = {}
        self.thread = threading.Thread(target=self._run, name="servegate-progress-relay", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                message = self.source.get(timeout=0.5)
            except queue_module.Empty:
                continue
            except (EOFError, OSError):
                return
            if message is None:
                return
            number, what, *args = message
            lane = self.lanes.setdefault(number, self.hook.lane(f"process {number}"))
            handler: Callable[..., None] = lane.start if what == "start" else lane.advance
            try:
                handler(*args)
            except Exception:  # noqa: BLE001 - a progress display must never stop a check
                log.debug("progress relay failed", exc_info=True)

    def stop(self) -> None:
        """End the thread once the messages sent so far are shown."""
        self.source.put(None)
        self.thread.join(timeout=5)
