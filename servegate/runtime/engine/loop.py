"""The reference engine's loop thread: step after step of schedule -> run model -> postprocess.

A step takes the engine lock twice, briefly: to schedule (after dropping aborted requests and failing
those past their deadline) and to advance the scheduler by the sampled tokens. The model, sampling,
detokenizing, the output checks and the sinks run without it, so submissions, overload decisions and
aborts never wait on a step.
"""

from __future__ import annotations

import logging
import time

from servegate.contracts.errors import ServingError
from servegate.runtime.engine.endings import deliver_failures, finish_requests
from servegate.runtime.engine.fallback_route import FallbackRoute
from servegate.runtime.engine.loop_jobs import LoopJobs
from servegate.runtime.engine.parts import EngineParts
from servegate.runtime.engine.request_state import RequestState
from servegate.runtime.engine.request_table import Failure, RequestTable
from servegate.runtime.engine.step_sampling import SampledTokens, sample_rows
from servegate.runtime.engine.step_trace import StepTrace
from servegate.runtime.failure_policy.outcomes import deadline_exceeded, past_deadline
from servegate.runtime.scheduling import SchedulerOutput, Sequence
from servegate.runtime.types import TokenEvent, token_id_name

log = logging.getLogger("servegate.runtime")


class EngineLoop:
    """Runs the steps of one reference engine on the thread that loaded its model."""

    def __init__(
        self,
        parts: EngineParts,
        table: RequestTable,
        jobs: LoopJobs,
        route: FallbackRoute | None,
        trace: StepTrace | None,
    ) -> None:
        assert parts.runner is not None and parts.scheduler is not None, "a generation engine's parts"
        self.parts = parts
        self.table = table
        self.jobs = jobs
        self.route = route
        self.trace = trace
        self._current: SchedulerOutput | None = None
        """The step being computed (its requests fail together if the model raises)."""
        self._wake_at: float | None = None
        self._news_seen = 0

    def run(self) -> None:
        """Step until the engine is shut down; a step that raises fails its requests, not the loop."""
        while not self.table.closed:
            try:
                if self.jobs.run():
                    continue
                if not self.step():
                    self._wait_for_work()
            except Exception as exc:  # a broken step must not stop the loop: its requests get the error
                log.exception("engine step failed")
                self._fail_step(exc)

    def step(self) -> bool:
        """One engine step: schedule -> run model -> postprocess. False when there was nothing to run."""
        began, arrivals, completed = time.perf_counter(), self.table.arrivals, self.table.completed
        scheduled = self._schedule()
        if scheduled is None:
            return False
        plan, rows = scheduled
        # a generating engine's parts have a runner and a scheduler (None only for task: embed, which never steps)
        logits = self.parts.runner.execute(plan.model_inputs)  # type: ignore[union-attr]
        sampled = sample_rows(self.parts, logits, rows)
        self._postprocess(self._advance(plan, sampled), sampled)
        self._current = None
        if self.trace is not None:
            ended = time.perf_counter()
            self.trace.record(plan, began, ended, self.table.arrivals - arrivals, self.table.completed - completed)
        return True

    def _schedule(self) -> tuple[SchedulerOutput, list[tuple[int, RequestState]]] | None:
        """The next step's plan and its sampling rows (row, request), or None when nothing runs (lock held)."""
        failures: list[Failure] = []
        table = self.table
        with table.lock:
            self._news_seen = table.news
            self._reap(time.monotonic(), failures)
            sched = table.scheduler
            assert sched is not None
            plan = sched.schedule(time.monotonic()) if sched.has_unfinished() else None
            for seq_id in plan.rejected if plan is not None else ():
                state = table.requests[seq_id]
                detail = f"the request needs {state.seq.max_total_tokens} tokens of KV cache, more than the pool holds"
                table.release(state)
                failures.append(Failure(state, ServingError("model_unavailable", detail=detail), "error"))
            self._wake_at = plan.wake_at if plan is not None else None
            self._current = None if plan is None or plan.is_empty else plan
            rows = [] if self._current is None else self._sampling_rows(self._current)
        deliver_failures(failures, self.route)
        return None if self._current is None else (self._current, rows)

    def _sampling_rows(self, plan: SchedulerOutput) -> list[tuple[int, RequestState]]:
        """The chunks that reach their sequence's last token, as (row of the logits, request) (lock held)."""
        requests = self.table.requests
        return [(i, requests[c.seq_id]) for i, c in enumerate(plan.chunks) if c.samples and c.seq_id in requests]

    def _reap(self, now: float, failures: list[Failure]) -> None:
        """Between steps: drop aborted requests and fail those past their deadline (lock held)."""
        for state in list(self.table.requests.values()):
            if state.aborted:
                self.table.release(state)
            elif past_deadline(now, state.deadline):
                self.table.release(state)
                failures.append(Failure(state, deadline_exceeded(state.timeout_s), "timeout"))

    def _advance(self, plan: SchedulerOutput, sampled: SampledTokens) -> list[tuple[Sequence, RequestState]]:
        """Advance the scheduler by the step; the sequences that got a token, with their requests."""
        with self.table.lock:
            grown = self.table.scheduler.update(plan, sampled.tokens)  # type: ignore[union-attr]  # see step()
            return [(seq, self.table.requests[seq.seq_id]) for seq in grown]

    def _postprocess(self, grown: list[tuple[Sequence, RequestState]], sampled: SampledTokens) -> None:
        """Detokenize each new token, stream it, and end the requests it completes (no lock held)."""
        now = time.monotonic()
        done: list[RequestState] = []
        for seq, state in grown:
            token = seq.output_token_ids[-1]
            logprob = sampled.logprobs.get(seq.seq_id)
            delta = state.output.add(token, logprob)
            if state.first_token_at is None:
                state.first_token_at = now
            wanted = (logprob,) if state.params.logprobs and logprob is not None else None
            # sampling appended this token's alternatives (a stream carries them per token, as OpenAI's does)
            top = (state.top_logprobs[-1],) if wanted and state.params.top_logprobs > 0 and state.top_logprobs else None
            names = (token_id_name(token),) if state.params.tokens_as_ids else None
            event = TokenEvent(state.request.id, (token,), delta.text, wanted, now, top_logprobs=top, tokens=names)
            state.delivery.token(event)
            if delta.finish_reason is not None:
                done.append(state)
        finish_requests(done, now, self.parts, self.table)

    def _fail_step(self, exc: Exception) -> None:
        """The step raised: its requests (every request, when it failed before planning) end with `internal`."""
        plan, self._current = self._current, None
        incident = f"{type(exc).__name__}-{int(time.time())}"
        failures: list[Failure] = []
        with self.table.lock:
            ids = [c.seq_id for c in plan.chunks] if plan is not None else list(self.table.requests)
            for seq_id in ids:
                state = self.table.requests.get(seq_id)
                if state is not None:
                    self.table.release(state)
                    failures.append(Failure(state, ServingError("internal", incident=incident), "error"))
        deliver_failures(failures, self.route)

    def _wait_for_work(self) -> None:
        """Sleep until something arrives, a job is queued, a deadline or the scheduler's wake time passes."""
        table = self.table
        with table.lock:
            if table.closed or table.news != self._news_seen or self.jobs.pending:
                return
            now = time.monotonic()
            wake = [s.deadline for s in table.requests.values()]
            if self._wake_at is not None:
                wake.append(self._wake_at)
            timeout = min([w - now for w in wake], default=1.0)
            if timeout > 0:
                table.lock.wait(timeout=min(timeout, 1.0))
