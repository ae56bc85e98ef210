"""Discrete-event simulation of the manifest's own scheduler on a virtual clock.

The simulation drives the runtime's real scheduler and KV block manager (`servegate.runtime.scheduling`),
so admission, batching windows, block accounting and preemption are exactly the engine's; only the
model is replaced: each step lasts what the latency model predicts for the chunks the scheduler
chose, times a log-normal jitter with the spread and the step-to-step correlation measured when
profiling (slow steps come in runs: a busy interpreter or a busy core stays busy for a while). Requests reach the
scheduler `overheads.request_s` after they are sent, plus `overheads.admission_delay_per_running_s` for every
sequence running at that moment; a token is seen when its step ends, and a
response ends `overheads.finish_s` after its last token; a step running while requests are sent to the
server lasts `overheads.arrival_s` longer per request, and a step that follows at once one which answered
requests lasts `overheads.completion_s` longer per answer, and every step is `overheads.load_slowdown_per_rps`
slower per request/s sent in the LOAD_WINDOW_S before it (terms.py). The failure policy's queue bound and deadline
apply as in the engine (runtime/failure_policy/outcomes.py decides both). Prefix caching is not
simulated (prompts are distinct).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servegate.capacity.bench.run_metrics import SLO, RequestRecord, summarize
from servegate.capacity.bench.workload import RequestSpec
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.terms import LOAD_WINDOW_S
from servegate.contracts.manifest import ServedModel
from servegate.runtime.failure_policy.outcomes import on_arrival, past_deadline


@dataclass(frozen=True)
class SimSetup:
    """What the simulated engine is: the batching mode, its numbers, the KV pool and the failure policy."""

    mode: str
    max_batch_size: int
    max_wait_s: float
    max_num_batched_tokens: int
    chunked_prefill: bool
    num_blocks: int
    block_size: int
    max_queue: int = 1_000_000
    overload: str = "reject"
    timeout_s: float = float("inf")

    @classmethod
    def from_manifest(cls, served: ServedModel, num_blocks: int, block_size: int) -> SimSetup:
        """The setup a manifest declares, for a pool of num_blocks x block_size tokens."""
        from servegate.runtime.scheduling import SchedulerConfig

        cfg = SchedulerConfig.from_manifest(served)
        fp = served.failure_policy
        return cls(
            mode=served.batching.mode,
            max_batch_size=cfg.max_batch_size,
            max_wait_s=cfg.max_wait_s,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            chunked_prefill=cfg.chunked_prefill,
            num_blocks=num_blocks,
            block_size=block_size,
            max_queue=fp.max_queue,
            overload=fp.overload,
            timeout_s=fp.request_timeout_s,
        )


@dataclass
class SimResult:
    """Per-request timelines (virtual seconds) plus the engine's state over time."""

    records: list[RequestRecord]
    queue_length: list[tuple[float, int]] = field(default_factory=list)
    """(time, requests waiting) after each step."""
    kv_blocks_used: list[tuple[float, int]] = field(default_factory=list)
    """(time, KV blocks in use) after each step."""
    running: list[tuple[float, int]] = field(default_factory=list)
    """(time, sequences running) after each step."""
    preemptions: int = 0
    steps: int = 0
    step_seconds: list[float] = field(default_factory=list)
    """How long each step lasted, in the order they ran (what `replay` takes back)."""

    def summary(self, slo: SLO | None = None) -> dict[str, Any]:
        """The bench-shaped summary plus queue and KV-memory figures."""
        out = summarize(self.records, slo)
        queue = [n for _, n in self.queue_length] or [0]
        kv = [n for _, n in self.kv_blocks_used] or [0]
        run = [n for _, n in self.running] or [0]
        out["queue_length"] = {"mean": float(np.mean(queue)), "max": int(max(queue))}
        out["kv_blocks_used"] = {"mean": float(np.mean(kv)), "max": int(max(kv))}
        out["running"] = {"mean": float(np.mean(run)), "max": int(max(run))}
        out["preemptions"] = self.preemptions
        out["steps"] = self.steps
        return out


def simulate(
    setup: SimSetup,
    model: LatencyModel,
    specs: Sequence[RequestSpec],
    *,
    concurrency: int | None = None,
    seed: int = 0,
    jitter: bool = True,
    replay: Sequence[float] | None = None,
) -> SimResult:
    """Run `specs` through the scheduler on a virtual clock.

    Open loop: each spec arrives at its arrival_s. Closed loop (`concurrency`): that many requests are
    in flight; each completion (or failure) sends the next at once. With `replay` (measured step durations in
    seconds, in the order the engine ran them) the k-th step lasts replay[k] as measured; steps beyond it are
    predicted (latency/replay.py).
    """
    from servegate.runtime.model.kv_blocks import KVBlockManager
    from servegate.runtime.scheduling import SchedulerConfig, make_scheduler
    from servegate.runtime.scheduling import Sequence as Seq

    cfg = SchedulerConfig(setup.max_batch_size, setup.max_wait_s, setup.max_num_batched_tokens, setup.chunked_prefill)
    scheduler = make_scheduler(setup.mode, cfg, KVBlockManager(setup.num_blocks, setup.block_size))
    rng = np.random.default_rng(seed)
    spread, overheads = model.jitter.spread, model.overheads
    sigma = math.sqrt(math.log1p(spread**2)) if jitter and spread > 0 else 0.0
    rho = min(max(model.jitter.correlation, 0.0), 0.99)
    slow = 0.0  # log of the current step's slowdown: an AR(1) process, so slow steps come in runs as measured
    pre, post = overheads.request_s, overheads.finish_s
    per_running = overheads.admission_delay_per_running_s

    records: list[RequestRecord] = []
    sends: list[float] = []  # every send time so far, sorted
    by_seq: dict[int, tuple[Seq, RequestRecord]] = {}
    # (time, stage, spec index), a heap: stage 0 = sent by the client, 1 = reaches the scheduler
    arrivals: list[tuple[float, int, int]] = []
    pending = list(range(len(specs)))[::-1]  # closed loop: specs not yet sent
    result = SimResult(records)

    def send(index: int, at: float) -> None:
        record = RequestRecord(scheduled=at, sent=at, prompt_tokens=specs[index].prompt_tokens)
        records.append(record)
        bisect.insort(sends, at)
        by_seq[index] = (None, record)  # type: ignore[assignment]
        heapq.heappush(arrivals, (at, 0, index))

    if concurrency is None:
        for i, spec in enumerate(specs):
            assert spec.arrival_s is not None, "open-loop specs need arrival_s (or give concurrency)"
            send(i, spec.arrival_s)
        pending = []
    else:
        for _ in range(min(concurrency, len(pending))):
            send(pending.pop(), 0.0)

    answered = 0  # requests the last step answered; their responses are sent while the next step runs
    last_end = -1.0

    def close(seq: Seq, record: RequestRecord, now: float, error: str | None = None) -> None:
        nonlocal answered
        answered += 1
        scheduler.finish(seq)
        record.error = error
        record.end = now + (post if error is None else 0.0)
        if pending:  # closed loop: the client sends its next request when this one returns
            send(pending.pop(), record.end)

    now = 0.0
    timeouts = not math.isinf(setup.timeout_s)
    while arrivals or scheduler.has_unfinished():
        while arrivals and arrivals[0][0] <= now:
            t, stage, index = heapq.heappop(arrivals)
            if stage == 0:  # the server reads it after its fixed overhead and the streaming work ahead of it
                heapq.heappush(arrivals, (t + pre + per_running * len(scheduler.running), 1, index))
                continue
            spec = specs[index]
            record = by_seq[index][1]
            seq = Seq(index, [index * 4099 + k for k in range(spec.prompt_tokens)], spec.output_tokens, arrival_time=t)
            by_seq[index] = (seq, record)
            arrival = on_arrival(setup, scheduler.num_queued(), scheduler.oldest_queued)
            if not arrival.admitted:
                record.error, record.end = "overloaded", t
                if pending:
                    send(pending.pop(), t)
                continue
            if arrival.shed is not None:
                close(arrival.shed, by_seq[arrival.shed.seq_id][1], t, "overloaded")
            scheduler.add(seq)
        for seq in [*scheduler.waiting, *scheduler.running] if timeouts else ():
            if past_deadline(now, seq.arrival_time + setup.timeout_s):
                close(seq, by_seq[seq.seq_id][1], now, "deadline_exceeded")
        output = scheduler.schedule(now)
        for seq_id in output.rejected:
            record = by_seq[seq_id][1]
            record.error, record.end = "input_too_long", now
            if pending:
                send(pending.pop(), now)
        if output.is_empty:
            nexts = [t for t in (arrivals[0][0] if arrivals else None, output.wake_at) if t is not None]
            if not nexts:
                if scheduler.has_unfinished():
                    raise RuntimeError("the scheduler holds requests but plans nothing and waits for nothing")
                break
            now = max(now, min(nexts))
            continue
        duration = model.step_time((c.num_tokens, c.start_pos) for c in output.chunks)
        if sigma:
            slow = rho * slow + math.sqrt(1 - rho * rho) * float(rng.normal(0.0, sigma))
            duration *= math.exp(slow - sigma * sigma / 2)
        if overheads.arrival_s:  # requests sent while this step runs are admitted on the same CPU
            during = bisect.bisect_left(sends, now + duration) - bisect.bisect_left(sends, now)
            duration += during * overheads.arrival_s
        if overheads.load_slowdown_per_rps:  # the HTTP work of recent requests takes CPU from the engine
            recent = bisect.bisect_left(sends, now) - bisect.bisect_left(sends, now - LOAD_WINDOW_S)
            duration *= 1.0 + overheads.load_slowdown_per_rps * recent / LOAD_WINDOW_S
        if now == last_end:  # back to back: the answers of the step before are sent during this one
            duration += answered * overheads.completion_s
        if replay is not None and result.steps < len(replay):
            duration = float(replay[result.steps])  # measured: it holds every cost predicted above
        answered = 0
        now += duration
        last_end = now
        result.steps += 1
        result.step_seconds.append(duration)
        result.preemptions += len(output.preempted)
        grown = scheduler.update(output, {c.seq_id: 0 for c in output.chunks if c.samples})
        for seq in grown:
            record = by_seq[seq.seq_id][1]
            record.token_times.append(now)
            record.output_tokens = len(seq.output_token_ids)
            if len(seq.output_token_ids) >= seq.max_tokens:
                close(seq, record, now)
        result.queue_length.append((now, scheduler.num_queued()))
        result.kv_blocks_used.append((now, scheduler.block_manager.num_used_blocks))
        result.running.append((now, len(scheduler.running)))
    return result
