"""The reference engine: servegate's own, in process, behind the Engine interface.

It is put together from small pieces, each in its module: the request table and its lock
(request_table.py), admission (admission.py), the loop thread's steps (loop.py), how requests end and
fail as the failure policy says (endings.py), the live counters (stats.py) and embeddings
(embeddings.py). Events go back through a per-request sink (an asyncio queue for `submit`, a list for
`generate`), called outside the engine lock.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from collections.abc import Sequence as Seq
from typing import Any

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.admission import Admission
from servegate.runtime.engine.embeddings import embed_texts, embedding_tokens
from servegate.runtime.engine.endings import deliver_failures
from servegate.runtime.engine.fallback_route import FallbackRoute
from servegate.runtime.engine.interface import Engine
from servegate.runtime.engine.loop import EngineLoop
from servegate.runtime.engine.loop_jobs import LoopJobs
from servegate.runtime.engine.part_types import Sampler
from servegate.runtime.engine.parts import EngineParts, build_parts
from servegate.runtime.engine.prompt_scoring import score_on_engine
from servegate.runtime.engine.request_table import Failure, RequestTable
from servegate.runtime.engine.stats import engine_stats
from servegate.runtime.engine.step_trace import StepTrace
from servegate.runtime.failure_policy.outcomes import feed_window, unavailable
from servegate.runtime.postprocess import Detokenizer
from servegate.runtime.types import (
    EngineStats,
    ErrorEvent,
    Event,
    FinishEvent,
    GenerationRequest,
    ModelRunner,
    PromptEncoder,
    Result,
    ScoreResult,
    Sink,
)


class ReferenceEngine:
    """servegate's in-process engine (implements `engine.interface.Engine`)."""

    def __init__(
        self,
        served: ServedModel,
        *,
        fallback: Engine | None = None,
        step_trace: StepTrace | None = None,
        runner: ModelRunner | None = None,
        tokenizer: Detokenizer | None = None,
        preprocessor: PromptEncoder | None = None,
        sampler: Sampler | None = None,
        model: Any = None,
    ) -> None:
        """`fallback`: the fallback manifest's engine; `step_trace`: where to record every step (closed at
        shutdown); `runner`, `tokenizer`, `preprocessor`, `sampler`, `model` replace what start() would
        otherwise load, for tests and benchmarks."""
        self.served = served
        self.parts: EngineParts | None = None
        # a fallback engine is built only for a manifest that declares failure_policy.fallback
        self.fallback_route = (
            FallbackRoute(fallback, served.failure_policy.fallback.triggers)  # type: ignore[union-attr]
            if fallback is not None
            else None
        )
        self.step_trace = step_trace
        self._given: dict[str, Any] = {
            "runner": runner,
            "tokenizer": tokenizer,
            "preprocessor": preprocessor,
            "sampler": sampler,
            "model": model,
        }
        self._table = RequestTable()
        self._jobs = LoopJobs(self._table.lock)
        self._admission: Admission | None = None
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

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
                self._use(build_parts(self.served, **self._given))
            if self.fallback_route is not None:
                self.fallback_route.start_sync()
            with self._table.lock:
                self._table.accepting = True

    def _use(self, parts: EngineParts) -> None:
        """Take the built parts: the scheduler goes under the table's lock, admission opens over them."""
        self.parts = parts
        self._table.scheduler = parts.scheduler
        if parts.scheduler is not None:
            self._admission = Admission(self.served, parts, self._table, self.fallback_route, self.step_trace)

    def _start_loop_thread(self) -> None:
        """Start the loop thread, have it build the parts, and wait for them (re-raising what failed)."""
        ready = threading.Event()
        failed: list[BaseException] = []
        loop: list[EngineLoop] = []

        def load_then_loop() -> None:
            try:
                parts = build_parts(self.served, **self._given)
                loop.append(EngineLoop(parts, self._table, self._jobs, self.fallback_route, self.step_trace))
                self._use(parts)
            except BaseException as exc:  # handed to start_sync's caller
                failed.append(exc)
                return
            finally:
                ready.set()
            loop[0].run()

        self._thread = threading.Thread(target=load_then_loop, name="servegate-engine", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            self._thread.join()
            self._thread = None
            raise failed[0]

    @property
    def closed(self) -> bool:
        """Whether shutdown has ended every request and stopped the loop."""
        return self._table.closed

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish within grace_s, fail the rest, stop the loop."""
        await asyncio.to_thread(self.shutdown_sync, grace_s)

    def shutdown_sync(self, grace_s: float = 10.0) -> None:
        """shutdown() for synchronous callers."""
        end = time.monotonic() + grace_s
        table = self._table
        with table.lock:
            table.accepting = False
            while table.requests and time.monotonic() < end:
                table.lock.wait(timeout=min(0.05, max(0.0, end - time.monotonic())))
            left = list(table.requests.values())
            for state in left:
                table.release(state)
            table.closed = True
            table.lock.notify_all()
        deliver_failures([Failure(s, unavailable("the server is shutting down"), None) for s in left], None)
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._jobs.cancel(ServingError("model_unavailable", detail="the engine shut down"))
        if self.step_trace is not None:
            self.step_trace.close()
        if self.fallback_route is not None:
            self.fallback_route.shutdown_sync(grace_s)

    # --- requests -------------------------------------------------------------------------------

    def enqueue(self, request: GenerationRequest, sink: Sink) -> None:
        """Accept a request from any thread; `sink` gets its events on the loop thread, outside the engine lock."""
        self._enqueue(request, sink)

    def _enqueue(self, request: GenerationRequest, sink: Sink) -> int | None:
        """enqueue(), returning the request's sequence id (None if it ended at once)."""
        if self.parts is None or not self._table.accepting:
            sink(ErrorEvent(request.id, unavailable("the engine is not running")))
            return None
        if self._admission is None:
            sink(ErrorEvent(request.id, ServingError("invalid_request", detail="this model serves embeddings only")))
            return None
        return self._admission.enqueue(request, sink)

    async def submit(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Queue a request; iterate its TokenEvents, ending with one FinishEvent or ErrorEvent."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        def sink(event: Event) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:  # the caller's loop is gone: nobody is listening any more
                pass

        seq_id = self._enqueue(request, sink)
        done = False
        try:
            while not done:
                event = await queue.get()
                done = isinstance(event, (FinishEvent, ErrorEvent))
                yield event
        finally:
            if not done and seq_id is not None:
                self._table.abort(seq_id)

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

    @property
    def scores_prompts(self) -> bool:
        """A generation model scores prompts (one prefill); an embedding model does not."""
        return self.served.preprocess.task == "generate"

    def score(self, requests: Seq[GenerationRequest]) -> list[ScoreResult]:
        """Prompt-token log-probabilities of each request (one prefill, nothing sampled), run between steps."""
        self.start_sync()
        assert self.parts is not None
        return score_on_engine(self.served, self.parts, self._jobs if self._thread is not None else None, requests)

    async def embed(self, texts: Seq[str], tenant: str | None = None) -> list[list[float]]:
        """Embedding vectors (task: embed only)."""
        return await embed_texts(self.served, self.parts, texts)

    def count_tokens(self, text: str) -> int | None:
        """Tokens `text` becomes: an embedding input after the embedder's truncation, a prompt after the
        preprocessor's (None before start())."""
        if self.parts is None:
            return None
        if self.parts.preprocessor is None:
            return embedding_tokens(self.parts, text)
        return len(self.parts.preprocessor.encode(GenerationRequest(id="count", prompt=text)).token_ids)

    @property
    def preprocessor(self) -> PromptEncoder | None:
        """The loaded Preprocessor, with its tokenizer and chat template (None until start(), or for task: embed)."""
        return self.parts.preprocessor if self.parts is not None else None

    @property
    def tokenizer(self) -> Detokenizer | None:
        """The model's tokenizer (None until start(), or for task: embed: the embedder keeps its own)."""
        return self.parts.tokenizer if self.parts is not None else None

    @property
    def why_no_tokenizer(self) -> str | None:
        """Why `tokenizer` is None: not started, or an embedding model's engine."""
        if self.parts is None:
            return "the engine has not started"
        if self.parts.tokenizer is None:
            return "an embedding model's tokenizer stays inside its embedder"
        return None

    @property
    def remote(self) -> bool:
        """servegate's own engine runs the model in this process."""
        return False

    @property
    def identity(self) -> None:
        """Nothing remote to report."""
        return None

    def stats(self) -> EngineStats:
        """Current counters."""
        return engine_stats(self._table, self.parts, self.fallback_route)
