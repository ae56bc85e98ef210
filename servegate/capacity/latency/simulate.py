"""Discrete-event simulation of the manifest's own scheduler on a virtual clock.

The simulation drives the runtime's real scheduler and KV block manager (`servegate.runtime.scheduling`),
so admission, batching windows, block accounting and preemption are exactly the engine's; only the
model is replaced: each step lasts what the latency model predicts for the chunks the scheduler
chose, times a log-normal jitter with the spread and the step-to-step correlation measured when
profiling (slow steps come in runs: a busy interpreter or a busy core stays busy for a while), times the machine's
drift where the profile measured one (a log-normal slowdown of median 1 that lasts in time, an Ornstein-Uhlenbeck
process on the virtual clock: a shared machine runs slower for a second or two, and every step and overhead started
meanwhile shares it; StepJitter.drift_spread). Requests reach the
scheduler `overheads.request_s` after they are sent, plus `overheads.admission_delay_per_running_s` for every
sequence running at that moment (or, replaying a trace, when they were measured to); a token is seen when its
step ends, and a response ends `overheads.finish_s` after its last token (or, replaying a trace that recorded the
way out, a request's tokens reach the client its measured first-token way out after their step ends, and its
response ends its measured final way out after it ended in the engine); a step running while requests are sent to the
server lasts `overheads.arrival_s` longer per request, and a step that follows at once one which answered
requests lasts `overheads.completion_s` longer per answer, and every step is `overheads.load_slowdown_per_rps`
slower per request/s sent in the LOAD_WINDOW_S before it (terms.py). At r requests/s served over the
SHARE_WINDOW_S before, the request overhead, every step and the finishing overhead take (1 + r x
`overheads.load_stretch_per_rps`) / (1 - r x `overheads.serving_work_s`) as long (the requests sharing the machine,
ServingOverheads.stretch). The failure policy's queue bound and deadline apply as in the engine
(runtime/failure_policy/outcomes.py decides both). Prefix caching is not
simulated (prompts are distinct).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from servegate.capacity.bench.run_metrics import SLO, RequestRecord, summarize
from servegate.capacity.bench.workload import RequestSpec
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.terms import LOAD_WINDOW_S, SHARE_WINDOW_S
from servegate.contracts.manifest import ServedModel
from servegate.runtime.failure_policy.outcomes import on_arrival, past_deadline

if TYPE_CHECKING:
    from servegate.runtime.scheduling import SchedulerOutput
    from servegate.runtime.scheduling import Sequence as Seq


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
    drift: bool = True,
    replay: Sequence[float] | None = None,
    admission_delays: Sequence[float | None] | None = None,
    way_out: Sequence[tuple[float | None, float | None]] | None = None,
) -> SimResult:
    """Run `specs` through the scheduler on a virtual clock.

    Open loop: each spec arrives at its arrival_s. Closed loop (`concurrency`): that many requests are
    in flight; each completion (or failure) sends the next at once. With `replay` (measured step durations in
    seconds, in the order the engine ran them) the k-th step lasts replay[k] as measured; steps beyond it are
    predicted (latency/replay.py). With `admission_delays` (per spec, seconds from its send to the engine's
    queue decision, as measured; None: not measured) spec i reaches the scheduler that long after it is sent,
    in place of the model's request overhead and admission delay. With `way_out` (per spec, seconds from the
    engine handing its first token, and its final event, to the client receiving them; None: not measured) spec i's
    tokens are seen that much after their step ends, and its response ends that much after it ended in the engine,
    in place of the model's finish overhead. Without `jitter` neither the step noise nor the drift's moments are
    drawn; without `drift` only the drift's moments are not: every moment then runs at the drift's mean slowdown
    (a capacity, which is a mean, reads the same under every seed).
    """
    noise = _StepNoise(model, seed, jitter, drift and jitter)
    run = _Simulation(setup, model, specs, noise, replay, admission_delays, way_out)
    run.send_first(concurrency)
    return run.run()


class _StepNoise:
    """The log-normal step slowdown: an AR(1) process in log space, so slow steps come in runs as measured; and the
    machine's drift, an Ornstein-Uhlenbeck process in log space on the virtual clock (StepJitter.drift_spread)."""

    def __init__(self, model: LatencyModel, seed: int, jitter: bool, drift: bool = False) -> None:
        spread = model.jitter.spread
        self.rng = np.random.default_rng(seed)
        self.sigma = math.sqrt(math.log1p(spread**2)) if jitter and spread > 0 else 0.0
        self.rho = min(max(model.jitter.correlation, 0.0), 0.99)
        self.slow = 0.0
        """Log of the current step's slowdown."""
        spread = model.jitter.drift_spread if model.jitter.drift_seconds > 0 else 0.0
        self.drift_sigma = spread if drift else 0.0
        self.drift_seconds = model.jitter.drift_seconds
        self.drift_mean = math.exp(spread * spread / 2)
        """The drift's mean factor, what every moment takes when its moments are not drawn."""
        # a stream of its own, so a seed's step noise is the same with and without drift (made only when drawn:
        # the planner simulates thousands of runs, most without a drift)
        self.drift_rng = np.random.default_rng([seed, 1]) if self.drift_sigma else None
        self.drift_log = float(self.drift_rng.normal(0.0, self.drift_sigma)) if self.drift_rng else 0.0
        """Log of the machine's slowdown at drift_time (drawn from the process's stationary law at 0)."""
        self.drift_time = 0.0

    def apply(self, duration: float) -> float:
        """The next step's duration once slowed down (mean-preserving); unchanged without jitter."""
        if not self.sigma:
            return duration
        rho, sigma = self.rho, self.sigma
        self.slow = rho * self.slow + math.sqrt(1 - rho * rho) * float(self.rng.normal(0.0, sigma))
        return duration * math.exp(self.slow - sigma * sigma / 2)

    def drift(self, at: float) -> float:
        """The machine's slowdown factor for work started at virtual time `at`: median 1 (the speed bursts measure),
        mean drift_mean; drift_mean itself when the moments are not drawn, 1.0 without drift. The process moves
        forward only: a query for an earlier time than the last one reads the last one's value."""
        sigma = self.drift_sigma
        if not sigma:
            return self.drift_mean
        assert self.drift_rng is not None
        if at > self.drift_time:  # the exact Ornstein-Uhlenbeck transition over the gap
            keep = math.exp(-(at - self.drift_time) / self.drift_seconds)
            fresh = float(self.drift_rng.normal(0.0, sigma * math.sqrt(1.0 - keep * keep)))
            self.drift_log, self.drift_time = self.drift_log * keep + fresh, at
        return math.exp(self.drift_log)


class _Simulation:
    """One simulated run: the scheduler, the requests in flight and the clock's events, stepped to the end."""

    def __init__(
        self,
        setup: SimSetup,
        model: LatencyModel,
        specs: Sequence[RequestSpec],
        noise: _StepNoise,
        replay: Sequence[float] | None,
        admission_delays: Sequence[float | None] | None = None,
        way_out: Sequence[tuple[float | None, float | None]] | None = None,
    ) -> None:
        from servegate.runtime.scheduling import SchedulerConfig, make_scheduler
        from servegate.runtime.scheduling.kv_blocks import KVBlockManager

        cfg = SchedulerConfig(
            setup.max_batch_size, setup.max_wait_s, setup.max_num_batched_tokens, setup.chunked_prefill
        )
        self.scheduler = make_scheduler(setup.mode, cfg, KVBlockManager(setup.num_blocks, setup.block_size))
        self.setup, self.model, self.specs, self.noise, self.replay = setup, model, specs, noise, replay
        self.admission_delays = admission_delays
        self.way_out = way_out
        self.result = SimResult([])
        self.sends: list[float] = []
        """Every send time so far, sorted."""
        self.served: list[float] = []
        """When each request that ended so far ended in the engine, in order."""
        self.record_of: dict[int, RequestRecord] = {}
        """Each sent request's record, by spec index (which is also its sequence id)."""
        self.arrivals: list[tuple[float, int, int]] = []
        """(time, stage, spec index), a heap: stage 0 = sent by the client, 1 = reaches the scheduler."""
        self.pending: list[int] = []
        """Closed loop: spec indices not yet sent, the next one last."""
        self.answered = 0
        """Requests the last step answered; their responses are sent while the next step runs."""
        self.last_end = -1.0
        """When the last step ended."""

    def send_first(self, concurrency: int | None) -> None:
        """Open loop: send every spec at its arrival_s; closed loop: send the first `concurrency` at 0."""
        if concurrency is None:
            for i, spec in enumerate(self.specs):
                assert spec.arrival_s is not None, "open-loop specs need arrival_s (or give concurrency)"
                self.send(i, spec.arrival_s)
            return
        self.pending = list(range(len(self.specs)))[::-1]
        for _ in range(min(concurrency, len(self.pending))):
            self.send(self.pending.pop(), 0.0)

    def send(self, index: int, at: float) -> None:
        """The client sends spec `index` at `at`."""
        record = RequestRecord(scheduled=at, sent=at, prompt_tokens=self.specs[index].prompt_tokens)
        self.result.records.append(record)
        bisect.insort(self.sends, at)
        self.record_of[index] = record
        heapq.heappush(self.arrivals, (at, 0, index))

    def send_next(self, at: float) -> None:
        """Closed loop: the client sends its next request when one returns (nothing in the open loop)."""
        if self.pending:
            self.send(self.pending.pop(), at)

    def refuse(self, index: int, at: float, error: str) -> None:
        """A request fails before it runs (a full queue, a prompt the pool can never hold)."""
        record = self.record_of[index]
        record.error, record.end = error, at + self.out_delay(index, 1, 0.0)
        self.send_next(record.end)

    def close(self, seq: Seq, now: float, error: str | None = None) -> None:
        """A request the scheduler holds ends: finished (its response ends `finish_s` later) or failed."""
        self.answered += 1
        self.served.append(now)
        self.scheduler.finish(seq)
        record = self.record_of[seq.seq_id]
        record.error = error
        finish = self.model.overheads.finish_s * self.stretch(now) * self.noise.drift(now) if error is None else 0.0
        record.end = now + self.out_delay(seq.seq_id, 1, finish)
        self.send_next(record.end)

    def out_delay(self, index: int, which: int, modelled: float) -> float:
        """Spec `index`'s measured way out (0: of its tokens, 1: of its final event), else `modelled`."""
        measured = self.way_out[index][which] if self.way_out is not None else None
        return modelled if measured is None else measured

    def run(self) -> SimResult:
        """Step the scheduler until every request has ended; the clock jumps to the next event when idle."""
        now = 0.0
        while self.arrivals or self.scheduler.has_unfinished():
            self.take_arrivals(now)
            self.expire(now)
            output = self.scheduler.schedule(now)
            for seq_id in output.rejected:
                self.refuse(seq_id, now, "input_too_long")
            if output.is_empty:
                wake = self.next_event(output)
                if wake is None:
                    if self.scheduler.has_unfinished():
                        raise RuntimeError("the scheduler holds requests but plans nothing and waits for nothing")
                    break
                now = max(now, wake)
                continue
            now = self.step(output, now)
        return self.result

    def take_arrivals(self, now: float) -> None:
        """Move every request due by `now` on: sent ones towards the server, arrived ones into the scheduler."""
        overheads = self.model.overheads
        while self.arrivals and self.arrivals[0][0] <= now:
            t, stage, index = heapq.heappop(self.arrivals)
            if stage == 0:  # the server reads it after its fixed overhead and the streaming work ahead of it
                measured = self.admission_delays[index] if self.admission_delays is not None else None
                running = len(self.scheduler.running)
                delay = overheads.request_s * self.stretch(t) * self.noise.drift(t)
                delay += overheads.admission_delay_per_running_s * running
                read = t + (delay if measured is None else measured)
                heapq.heappush(self.arrivals, (read, 1, index))
            else:
                self.admit(index, t)

    def admit(self, index: int, t: float) -> None:
        """Spec `index` reaches the scheduler at `t`: the failure policy's queue bound admits, sheds or refuses."""
        from servegate.runtime.scheduling import Sequence as Seq

        spec = self.specs[index]
        seq = Seq(index, [index * 4099 + k for k in range(spec.prompt_tokens)], spec.output_tokens, arrival_time=t)
        arrival = on_arrival(self.setup, self.scheduler.num_queued(), self.scheduler.oldest_queued)
        if not arrival.admitted:
            self.refuse(index, t, "overloaded")
            return
        if arrival.shed is not None:
            self.close(arrival.shed, t, "overloaded")
        self.scheduler.add(seq)

    def expire(self, now: float) -> None:
        """Fail every request past the failure policy's deadline at `now`."""
        if math.isinf(self.setup.timeout_s):
            return
        for seq in [*self.scheduler.waiting, *self.scheduler.running]:
            if past_deadline(now, seq.arrival_time + self.setup.timeout_s):
                self.close(seq, now, "deadline_exceeded")

    def next_event(self, output: SchedulerOutput) -> float | None:
        """When something can happen next while nothing runs: an arrival or the scheduler's wake-up."""
        nexts = [t for t in (self.arrivals[0][0] if self.arrivals else None, output.wake_at) if t is not None]
        return min(nexts) if nexts else None

    def step(self, output: SchedulerOutput, now: float) -> float:
        """Run the step the scheduler planned from `now`, hand out its tokens, and return when it ends."""
        duration = self.step_seconds(output, now)
        self.answered = 0
        now += duration
        self.last_end = now
        result = self.result
        result.steps += 1
        result.step_seconds.append(duration)
        result.preemptions += len(output.preempted)
        grown = self.scheduler.update(output, {c.seq_id: 0 for c in output.chunks if c.samples})
        for seq in grown:
            record = self.record_of[seq.seq_id]
            record.token_times.append(now + self.out_delay(seq.seq_id, 0, 0.0))
            record.output_tokens = len(seq.output_token_ids)
            if len(seq.output_token_ids) >= seq.max_tokens:
                self.close(seq, now)
        result.queue_length.append((now, self.scheduler.num_queued()))
        result.kv_blocks_used.append((now, self.scheduler.block_manager.num_used_blocks))
        result.running.append((now, len(self.scheduler.running)))
        return now

    def step_seconds(self, output: SchedulerOutput, now: float) -> float:
        """How long a step starting at `now` lasts: the step cost, jittered, plus what serving adds (or as replayed)."""
        duration = self.noise.apply(self.model.step_time((c.num_tokens, c.start_pos) for c in output.chunks))
        duration = self.with_serving_work(duration, now) * self.noise.drift(now)
        steps, replay = self.result.steps, self.replay
        if replay is not None and steps < len(replay):
            duration = float(replay[steps])  # measured: it holds every cost predicted above
        return duration

    def with_serving_work(self, duration: float, now: float) -> float:
        """A step's duration once the HTTP work done on the engine's CPU while it runs is added."""
        overheads, sends = self.model.overheads, self.sends
        if overheads.arrival_s:  # requests sent while this step runs are admitted on the same CPU
            during = bisect.bisect_left(sends, now + duration) - bisect.bisect_left(sends, now)
            duration += during * overheads.arrival_s
        if overheads.load_slowdown_per_rps:  # the HTTP work of recent requests takes CPU from the engine
            recent = bisect.bisect_left(sends, now) - bisect.bisect_left(sends, now - LOAD_WINDOW_S)
            duration *= 1.0 + overheads.load_slowdown_per_rps * recent / LOAD_WINDOW_S
        if now == self.last_end:  # back to back: the answers of the step before are sent during this one
            duration += self.answered * overheads.completion_s
        return duration * self.stretch(now)

    def stretch(self, now: float) -> float:
        """How much longer a part of a request (a step, an overhead) starting at `now` takes while the requests hold
        their share of the machine (ServingOverheads.stretch), at the rate requests were served (ended in the
        engine) over the SHARE_WINDOW_S before: the work done, which the sends overstate past the knee (a
        backlog holds no share of the cores) and in a closed loop's first burst."""
        if not self.model.overheads.stretches:  # skips counting the served requests, on every step
            return 1.0
        served = self.served
        recent = len(served) - bisect.bisect_right(served, now - SHARE_WINDOW_S)
        return self.model.overheads.stretch(recent / SHARE_WINDOW_S)
