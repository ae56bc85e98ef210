"""The reference engine: schedule -> run model -> postprocess, in a worker thread, behind the Engine API.

Threads: callers (an asyncio server, `generate`, `gate run`) submit from their own threads; a single
worker thread runs the steps. One lock guards the scheduler and the per-request state; the worker
releases it while the model runs, so submissions, overload decisions and aborts never wait on a step.
Events go back through a per-request sink (an asyncio queue for `submit`, a list for `generate`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from collections.abc import Sequence as Seq
from typing import Any

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.interface import (
    EngineStats,
    ErrorEvent,
    Event,
    FinishEvent,
    GenerationRequest,
    Result,
    ScoreResult,
    Sink,
    TokenEvent,
)
from servegate.runtime.engine.loop_jobs import LoopJobs
from servegate.runtime.engine.parts import EngineParts, build_parts
from servegate.runtime.engine.prompt_scoring import score_on_engine
from servegate.runtime.engine.request_state import RequestState, new_request_state
from servegate.runtime.engine.step_trace import open_step_trace
from servegate.runtime.failure_policy.fallback import FallbackRoute
from servegate.runtime.failure_policy.outcomes import Trigger, deadline_exceeded, feed_window, overloaded, unavailable
from servegate.runtime.scheduling import SchedulerOutput

log = logging.getLogger("servegate.runtime")


class ReferenceEngine:
    """servegate's in-process engine (implements `engine.interface.Engine`)."""

    def __init__(self, served: ServedModel, *, fallback: Any = None, **parts: Any) -> None:
        """`fallback`: the fallback manifest's engine; `parts` (runner, tokenizer, preprocessor, sampler)
        replace what start() would otherwise load, for tests and benchmarks."""
        self.served = served
        self._given_parts = parts
        self.parts: EngineParts | None = None
        self._fallback = (
            FallbackRoute(fallback, served.failure_policy.fallback.triggers) if fallback is not None else None
        )
        self._cv = threading.Condition()
        self._requests: dict[int, RequestState] = {}
        self._next_seq_id = 0
        self._accepting = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._current: SchedulerOutput | None = None
        """The step being computed (its requests fail together if the model raises)."""
        self._wake_at: float | None = None
        self._news = 0
        """Counts arrivals and aborts, so the loop never sleeps through one that came during a step."""
        self._news_seen = 0
        self._arrivals = 0
        """Requests accepted so far (a step trace records how many arrived while each step ran)."""
        self._completed = 0
        """Requests answered so far (a step trace records how many each step finished)."""
        self._trace = open_step_trace()
        self._jobs = LoopJobs(self._cv)

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load weights, allocate the KV pool and start the scheduling loop."""
        await asyncio.to_thread(self.start_sync)

    def start_sync(self) -> None:
        """start() for synchronous callers (generate, `gate run`); a second call does nothing.

        A generation engine loads its model on its own loop thread, which then runs every step: torch's OpenMP
        pools per thread, once they outnumber the cores, stop spinning and must be woken for each op (a compiled
        134M decode step: 34-46 ms on a second thread, 27-36 ms on the loading one; benchmarks/README.md).
        """
        with self._start_lock:
            if self.parts is not None:
                return
            if self.served.preprocess.task == "generate":
                self._start_loop_thread()
            else:
                self.parts = build_parts(self.served, **self._given_parts)
            if self._fallback is not None:
                self._fallback.start_sync()
            self._accepting = True

    def _start_loop_thread(self) -> None:
        """Start the loop thread, have it build the parts, and wait for them (re-raising what failed)."""
        ready = threading.Event()
        failed: list[BaseException] = []

        def load_then_loop() -> None:
            try:
                self.parts = build_parts(self.served, **self._given_parts)
            except BaseException as exc:  # handed to start_sync's caller
                failed.append(exc)
                return
            finally:
                ready.set()
            self._loop()

        self._thread = threading.Thread(target=load_then_loop, name="servegate-engine", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            self._thread.join()
            self._thread = None
            raise failed[0]

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish within grace_s, fail the rest, stop the loop."""
        await asyncio.to_thread(self.shutdown_sync, grace_s)

    def shutdown_sync(self, grace_s: float = 10.0) -> None:
        """shutdown() for synchronous callers."""
        end = time.monotonic() + grace_s
        with self._cv:
            self._accepting = False
            while self._requests and time.monotonic() < end:
                self._cv.wait(timeout=min(0.05, max(0.0, end - time.monotonic())))
            for state in list(self._requests.values()):
                self._fail(state, unavailable("the server is shutting down"), trigger=None)
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._jobs.cancel(ServingError("model_unavailable", detail="the engine shut down"))
        if self._trace is not None:
            self._trace.close()
        if self._fallback is not None:
            self._fallback.shutdown_sync(grace_s)

    # --- requests -------------------------------------------------------------------------------

    async def submit(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Queue a request; iterate its TokenEvents, ending with one FinishEvent or ErrorEvent."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        def sink(event: Event) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:  # the caller's loop is gone: nobody is listening any more
                pass

        seq_id = self.enqueue(request, sink)
        done = False
        try:
            while not done:
                event = await queue.get()
                done = isinstance(event, (FinishEvent, ErrorEvent))
                yield event
        finally:
            if not done and seq_id is not None:
                self._abort(seq_id)

    def generate(self, requests: Seq[GenerationRequest]) -> list[Result]:
        """Run all requests (batched per the manifest); results in input order.

        Requests are fed through a window of feed_window() in flight, so a long list never trips the
        overload policy by itself and each deadline counts from when its request was fed.
        """
        self.start_sync()
        results: list[Result | None] = [None] * len(requests)
        slots = threading.Semaphore(feed_window(self.served))
        finished = threading.Semaphore(0)

        def sink_for(i: int) -> Sink:
            def sink(event: Event) -> None:
                if isinstance(event, (FinishEvent, ErrorEvent)):
                    results[i] = event
                    slots.release()
                    finished.release()

            return sink

        for i, request in enumerate(requests):
            slots.acquire()
            self.enqueue(request, sink_for(i))
        for _ in requests:
            finished.acquire()
        return [r for r in results if r is not None]

    def score(self, requests: Seq[GenerationRequest]) -> list[ScoreResult]:
        """Prompt-token log-probabilities of each request (one prefill, nothing sampled), run between steps."""
        return score_on_engine(self, self._jobs, requests)

    async def embed(self, texts: Seq[str], tenant: str | None = None) -> list[list[float]]:
        """Embedding vectors (task: embed only)."""
        if self.served.preprocess.task != "embed" or self.parts is None or self.parts.embedder is None:
            raise ServingError("invalid_request", detail="this model generates text; it serves no embeddings")
        vectors = await asyncio.to_thread(self.parts.embedder.embed, list(texts))
        return [list(map(float, v)) for v in vectors]

    @property
    def preprocessor(self) -> Any:
        """The loaded Preprocessor, with its tokenizer and chat template (None until start(), or for task: embed)."""
        return self.parts.preprocessor if self.parts is not None else None

    def count_tokens(self, text: str) -> int:
        """Tokens an embedding input becomes (after the manifest's truncation), for the response's usage."""
        embedder = self.parts.embedder if self.parts is not None else None
        return len(embedder.tokenize(text)[0]) if embedder is not None else 0

    def stats(self) -> EngineStats:
        """Current counters."""
        with self._cv:
            if self.parts is None or self.parts.scheduler is None:
                return EngineStats()
            sched, bm = self.parts.scheduler, self.parts.scheduler.block_manager
            cache = self.parts.response_cache
            return EngineStats(
                queue_depth=sched.num_queued(),
                running=len(sched.running),
                kv_blocks_used=bm.num_used_blocks,
                kv_blocks_free=bm.num_free_blocks,
                prefix_cache_hits=bm.hits,
                prefix_cache_misses=bm.misses,
                response_cache_hits=cache.hits if cache is not None else 0,
                fallback_uses=self._fallback.uses if self._fallback is not None else 0,
                preemptions=sched.num_preemptions,
            )

    def enqueue(self, request: GenerationRequest, sink: Sink) -> int | None:
        """Accept a request whose events go to `sink`; returns its sequence id (None if it ended at once)."""
        if self.parts is None or not self._accepting:
            sink(ErrorEvent(request.id, unavailable("the engine is not running")))
            return None
        parts = self.parts
        if parts.scheduler is None:
            sink(ErrorEvent(request.id, ServingError("invalid_request", detail="this model serves embeddings only")))
            return None
        if parts.response_cache is not None:
            hit = parts.response_cache.get(request)
            if hit is not None:
                sink(TokenEvent(request.id, hit.token_ids, hit.text, hit.logprobs, time.monotonic(), cached=True))
                sink(hit)
                return None
        try:
            with self._cv:
                seq_id = self._next_seq_id
                self._next_seq_id += 1
            state = new_request_state(self.served, parts, request, sink, seq_id)
        except ServingError as error:
            sink(ErrorEvent(request.id, error))
            return None
        with self._cv:
            if time.monotonic() >= state.deadline:
                self._fail(state, deadline_exceeded(state.timeout_s), trigger="timeout", registered=False)
                return None
            policy = self.served.failure_policy
            if parts.scheduler.num_queued() >= policy.max_queue:
                victim = parts.scheduler.oldest_queued() if policy.overload == "shed-oldest" else None
                if victim is None:
                    self._fail(state, overloaded(policy), trigger="overload", registered=False)
                    return None
                self._fail(self._requests[victim.seq_id], overloaded(policy), trigger="overload")
            self._requests[seq_id] = state
            parts.scheduler.add(state.seq)
            self._news += 1
            self._arrivals += 1
            self._cv.notify_all()
        return seq_id

    def _abort(self, seq_id: int) -> None:
        """The caller stopped listening: drop the request at the next step boundary."""
        with self._cv:
            state = self._requests.get(seq_id)
            if state is not None:
                state.aborted = True
                self._news += 1
                self._cv.notify_all()

    # --- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closed:
            try:
                if self._jobs.run():
                    continue
                if not self.step():
                    self._wait_for_work()
            except Exception as exc:  # a broken step must not stop the loop: its requests get the error
                log.exception("engine step failed")
                self._fail_step(exc)

    def step(self) -> bool:
        """One engine step: schedule -> run model -> postprocess. False when there was nothing to run."""
        began, arrivals, completed = time.perf_counter(), self._arrivals, self._completed
        if (plan := self._schedule()) is None:
            return False
        logits = self.parts.runner.execute(plan.model_inputs)  # type: ignore[union-attr]
        self._postprocess(plan, logits)
        if self._trace is not None:
            ended = time.perf_counter()
            self._trace.record(plan, began, ended, self._arrivals - arrivals, self._completed - completed)
        return True

    def _schedule(self) -> SchedulerOutput | None:
        with self._cv:
            self._news_seen = self._news
            self._reap(time.monotonic())
            sched = self.parts.scheduler  # type: ignore[union-attr]
            if not sched.has_unfinished():
                return None
            plan = sched.schedule(time.monotonic())
            for seq_id in plan.rejected:
                state = self._requests[seq_id]
                detail = f"the request needs {state.seq.max_total_tokens} tokens of KV cache, more than the pool holds"
                self._fail(state, ServingError("model_unavailable", detail=detail), trigger="error")
            self._wake_at = plan.wake_at
            self._current = None if plan.is_empty else plan
            return self._current

    def _postprocess(self, plan: SchedulerOutput, logits: Any) -> None:
        """Sample the chunks that reached their last token, advance the scheduler, stream, finish."""
        parts = self.parts
        assert parts is not None
        with self._cv:
            # a request failed mid-step (shutdown) is no longer registered: its row is ignored
            rows = [i for i, c in enumerate(plan.chunks) if c.samples and c.seq_id in self._requests]
            states = [self._requests[plan.chunks[i].seq_id] for i in rows]
            sampled: dict[int, int] = {}
            logprobs: dict[int, float] = {}
            if rows:
                tokens, token_logprobs = parts.sampler(
                    logits[rows], [s.params for s in states], [s.generator for s in states]
                )
                for state, token, logprob in zip(states, _as_list(tokens), _as_list(token_logprobs), strict=True):
                    sampled[state.seq.seq_id] = int(token)
                    logprobs[state.seq.seq_id] = float(logprob)
                for row, state in zip(rows, states, strict=True):
                    if state.params.top_logprobs > 0:
                        state.top_logprobs.append(
                            _alternatives(logits[row], state.params.top_logprobs, parts.tokenizer)
                        )
            now = time.monotonic()
            for seq in parts.scheduler.update(plan, sampled):  # type: ignore[union-attr]
                state = self._requests[seq.seq_id]
                delta = state.output.add(seq.output_token_ids[-1], logprobs.get(seq.seq_id))
                if state.first_token_at is None:
                    state.first_token_at = now
                want_logprobs = state.params.logprobs
                state.sink(
                    TokenEvent(
                        state.request.id,
                        (seq.output_token_ids[-1],),
                        delta.text,
                        (logprobs[seq.seq_id],) if want_logprobs else None,
                        now,
                    )
                )
                state.streamed = True
                if delta.finish_reason is not None:
                    self._complete(state, now)
            self._current = None

    def _complete(self, state: RequestState, now: float) -> None:
        parts = self.parts
        assert parts is not None
        result = state.finish_event(now, parts.validator)
        parts.scheduler.finish(state.seq)  # type: ignore[union-attr]
        del self._requests[state.seq.seq_id]
        self._completed += 1
        if isinstance(result, ErrorEvent):
            state.sink(result)
        else:
            if parts.response_cache is not None:
                parts.response_cache.put(state.request, result)
            state.sink(result)
        self._cv.notify_all()

    def _reap(self, now: float) -> None:
        """Between steps: drop aborted requests and fail those past their deadline."""
        for state in list(self._requests.values()):
            if state.aborted:
                self.parts.scheduler.finish(state.seq)  # type: ignore[union-attr]
                del self._requests[state.seq.seq_id]
                self._cv.notify_all()
            elif now >= state.deadline:
                self._fail(state, deadline_exceeded(state.timeout_s), trigger="timeout")

    def _fail(
        self,
        state: RequestState,
        error: ServingError,
        *,
        trigger: Trigger | None,
        registered: bool = True,
    ) -> None:
        """End a request with `error`, or hand it to the fallback if the policy says so and nothing streamed."""
        if registered and self.parts is not None and self.parts.scheduler is not None:
            self.parts.scheduler.finish(state.seq)
            self._requests.pop(state.seq.seq_id, None)
        route = self._fallback
        if trigger is not None and route is not None and route.covers(trigger) and not state.streamed:
            route.forward(state.request, state.sink)
        else:
            state.sink(ErrorEvent(state.request.id, error))
        self._cv.notify_all()

    def _fail_step(self, exc: Exception) -> None:
        plan, self._current = self._current, None
        incident = f"{type(exc).__name__}-{int(time.time())}"
        with self._cv:
            ids = [c.seq_id for c in plan.chunks] if plan is not None else list(self._requests)
            for seq_id in ids:
                state = self._requests.get(seq_id)
                if state is not None:
                    self._fail(state, ServingError("internal", incident=incident), trigger="error")

    def _wait_for_work(self) -> None:
        with self._cv:
            if self._closed or self._news != self._news_seen or self._jobs.pending:
                return
            now = time.monotonic()
            wake = [s.deadline for s in self._requests.values()]
            if self._wake_at is not None:
                wake.append(self._wake_at)
            timeout = min([w - now for w in wake], default=1.0)
            if timeout > 0:
                self._cv.wait(timeout=min(timeout, 1.0))


def _alternatives(logits: Any, n: int, tokenizer: Any) -> dict[str, float]:
    """The n most likely tokens at one position, as {token text: log-probability}."""
    from servegate.runtime.model.sampling import top_logprobs

    values, ids = top_logprobs(logits[None], n)
    return {tokenizer.decode([int(i)]): float(v) for v, i in zip(values[0].tolist(), ids[0].tolist(), strict=True)}


def _as_list(values: Any) -> list[Any]:
    return values.tolist() if hasattr(values, "tolist") else list(values)
