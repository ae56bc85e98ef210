"""What a scheduler decides for one engine step: plain data that tests assert on."""

from __future__ import annotations

from dataclasses import dataclass, field

from servegate.runtime.types import SeqChunk


@dataclass(frozen=True)
class ScheduledChunk:
    """One sequence's share of a step."""

    seq_id: int
    num_tokens: int
    """Tokens computed this step (the whole prompt, a prefill chunk, or 1 for a decode)."""
    start_pos: int
    """Tokens of the sequence already in the KV cache before this step."""
    samples: bool
    """True when the chunk reaches the sequence's last known token, so its logits give the next token."""
    model_input: SeqChunk = field(repr=False, compare=False)
    """The same chunk as the model runner takes it (its token ids and block table filled in)."""


@dataclass(frozen=True)
class SchedulerOutput:
    """A step's plan: which sequences run, how many tokens each, and what changed in the queues."""

    chunks: tuple[ScheduledChunk, ...] = ()
    """Sequences computed this step, in the order their logits come back."""
    admitted: tuple[int, ...] = ()
    """seq_ids that left the waiting queue this step (new, or resumed after preemption)."""
    preempted: tuple[int, ...] = ()
    """seq_ids preempted this step: their blocks were freed and they wait to be recomputed."""
    num_batched_tokens: int = 0
    """Sum of num_tokens over chunks (bounded by max_num_batched_tokens in continuous mode)."""
    num_cached_tokens: int = 0
    """Prompt tokens of admitted sequences served by the prefix cache instead of computed."""
    padded_slots: int = 0
    """Static batching: slots of the fixed batch that compute nothing this step (empty or finished)."""
    wake_at: float | None = None
    """time.monotonic() at which to schedule again even if nothing arrives (a batch window closing)."""
    rejected: tuple[int, ...] = field(default=())
    """seq_ids that can never be scheduled (need more blocks than the whole pool); the engine fails them."""

    @property
    def model_inputs(self) -> tuple[SeqChunk, ...]:
        """The chunks as the model runner takes them, in the same order."""
        return tuple(chunk.model_input for chunk in self.chunks)

    @property
    def is_empty(self) -> bool:
        """Nothing to compute this step."""
        return not self.chunks
