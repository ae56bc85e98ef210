"""The Engine protocol's members that the test fakes built around an async `submit` share.

A fake keeps its own `start`, `shutdown`, `submit`, `generate`, `embed` and `stats`; this base answers the
rest as a fake without a tokenizer does: synchronous start and shutdown over the async ones, `enqueue` over
`submit` (servegate's SinkRelay, as the endpoint engine does it), no prompt scoring, one token per character,
nothing remote.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from servegate.contracts.errors import ServingError
from servegate.runtime.engine.sink_relay import SinkRelay
from servegate.runtime.types import ErrorEvent, Event, GenerationRequest, ScoreResult, Sink


class FakeEngineBase:
    """Sync lifecycle, enqueue, score, tokenizer, identity and token counting for a fake engine."""

    started: bool = False
    _sink_relay: SinkRelay | None = None

    async def start(self) -> None:
        """Overridden by the fake."""
        self.started = True

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Overridden by the fake."""

    def submit(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Overridden by the fake."""
        raise NotImplementedError

    def start_sync(self) -> None:
        """start() on a loop of its own; a second call does nothing."""
        if not self.started:
            asyncio.run(self.start())

    def shutdown_sync(self, grace_s: float = 10.0) -> None:
        """shutdown() on a loop of its own, then stop the relay enqueue() uses."""
        asyncio.run(self.shutdown(grace_s))
        if self._sink_relay is not None:
            self._sink_relay.stop()

    def enqueue(self, request: GenerationRequest, sink: Sink) -> None:
        """submit() on the relay's loop; the events go to `sink`."""
        if self._sink_relay is None:
            self._sink_relay = SinkRelay(f"{type(self).__name__}-relay")
        self._sink_relay.enqueue(self.submit, request, sink)

    @property
    def scores_prompts(self) -> bool:
        """A fake has no model to score prompts with."""
        return False

    def score(self, requests: Sequence[GenerationRequest]) -> list[ScoreResult]:
        """Every request refused: there is no model to score with."""
        error = ServingError("unsupported_parameter", param="echo", detail="this fake engine cannot score prompts")
        return [ErrorEvent(r.id, error) for r in requests]

    def count_tokens(self, text: str) -> int | None:
        """One token per character."""
        return len(text)

    @property
    def tokenizer(self) -> None:
        """No tokenizer: token ids and logprob token names are not looked up."""
        return None

    @property
    def why_no_tokenizer(self) -> str:
        """Why there is no tokenizer."""
        return "a fake engine reads one character per token and has no tokenizer"

    @property
    def remote(self) -> bool:
        """In process."""
        return False

    @property
    def identity(self) -> None:
        """Nothing remote to report."""
        return None
