"""The engine interface every caller uses: the HTTP server, the gates, the bench and `gate run`.

An engine is built from a ServedModel by `servegate.runtime.build(served)`; the reference engine runs in
process, the endpoint engine forwards to any OpenAI-compatible server. Both satisfy `Engine`. The data it
takes and gives (requests, sampling parameters, events, results, counters) is `servegate.runtime.types`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, runtime_checkable

from servegate.contracts.manifest import ServedModel
from servegate.runtime.types import EngineStats, Event, GenerationRequest, Result, ScoreResult, Sink


def vocab_size(engine: Engine) -> int | None:
    """The size of the tokenizer the engine encodes with (token ids are 0 to size - 1); None where it has none."""
    tokenizer = engine.tokenizer
    return len(tokenizer) if tokenizer is not None else None


class EngineIdentity(Protocol):
    """What a remote engine reported itself to be at start (remote/identity.RemoteIdentity)."""

    @property
    def engine(self) -> str:
        """`vllm`, `servegate`, or what the server calls itself."""

    @property
    def version(self) -> str | None:
        """The engine's version, when it reports one."""

    @property
    def models(self) -> tuple[str, ...]:
        """Model ids it serves."""

    @property
    def max_model_len(self) -> int | None:
        """Context length it reports for the served model, else None."""

    def as_engine(self) -> dict[str, Any]:
        """The manifest's runtime.engine form of this identity."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form for reports."""


@runtime_checkable
class Engine(Protocol):
    """What the server, gates and bench call: every member is declared here and every engine has it, so no
    caller probes an engine (vLLM's EngineClient is the model). Every submitted request ends in one Result."""

    served: ServedModel

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load what the engine runs on (weights and KV pool, or the tokenizer and the remote's identity)."""

    def start_sync(self) -> None:
        """start() for synchronous callers; a second call does nothing."""

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop accepting, finish in-flight work within grace_s, release resources."""

    def shutdown_sync(self, grace_s: float = 10.0) -> None:
        """shutdown() for synchronous callers (not from inside a running event loop's thread)."""

    # --- requests -------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Queue a request; iterate its TokenEvents, ending with one FinishEvent or ErrorEvent."""

    def enqueue(self, request: GenerationRequest, sink: Sink) -> None:
        """Queue a request from any thread; its events go to `sink`, in order, ending with one Result."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Result]:
        """Synchronous convenience: run all requests (batched per the manifest), results in input order."""

    def score(self, requests: Sequence[GenerationRequest]) -> list[ScoreResult]:
        """Prompt-token log-probabilities of each request's prompt (sampling parameters are ignored), in order;
        an ErrorEvent for each where the engine cannot score (`scores_prompts` is False)."""

    async def embed(self, texts: Sequence[str], tenant: str | None = None) -> list[list[float]]:
        """Embedding vectors (task: embed only)."""

    def count_tokens(self, text: str) -> int | None:
        """Tokens `text` becomes as this engine's input (after the manifest's truncation), for usage reports;
        None where the engine has no tokenizer to count with."""

    def stats(self) -> EngineStats:
        """Current counters."""

    # --- what callers ask of it -----------------------------------------------------------------

    @property
    def scores_prompts(self) -> bool:
        """Whether `score` gives prompt log-probabilities (lm-eval's log-likelihoods, echo, prompt_logprobs)."""

    @property
    def preprocessor(self) -> Any:
        """The manifest's prompt encoder (runtime/preprocess.Preprocessor: tokenizer, chat template, limits) once
        started, on every backend that loads the manifest's tokenizer; None before start() or where there is
        none (an embedding model's engine)."""

    @property
    def tokenizer(self) -> Any:
        """The manifest's tokenizer the engine encodes and decodes with (on every backend that loads it, the
        endpoint's included); None where it has none, and `why_no_tokenizer` says why."""

    @property
    def why_no_tokenizer(self) -> str | None:
        """Why `tokenizer` is None (not started, an embedding model, a fake without one); None when it is not."""

    @property
    def remote(self) -> bool:
        """Whether the model runs outside this process (an endpoint, a vLLM server), not in servegate's engine."""

    @property
    def identity(self) -> EngineIdentity | None:
        """What a remote reported itself to be at start; None for servegate's own engine and before start()."""
