"""What every scheduler shares: its queues, the step bookkeeping, and the plan it hands the engine.

A scheduler owns the waiting queue, the running set and every call into the KV block manager (so it
alone decides preemption). The engine calls, once per step:

    output = scheduler.schedule(now)           # which sequences, how many tokens each
    logits = runner.execute(output.model_inputs)
    scheduler.update(output, sampled)          # computed tokens advance, full blocks are published
    scheduler.finish(seq)                      # for each sequence the engine finds done
"""

from __future__ import annotations

import abc
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from servegate.contracts.manifest import ServedModel
from servegate.runtime.scheduling.kv_blocks import KVBlockManager
from servegate.runtime.scheduling.output import ScheduledChunk, SchedulerOutput
from servegate.runtime.scheduling.sequence import SeqStatus, Sequence
from servegate.runtime.types import SeqChunk


@dataclass(frozen=True)
class SchedulerConfig:
    """The batching section's numbers, in the units the schedulers use."""

    max_batch_size: int = 8
    """Most sequences computed in one step."""
    max_wait_s: float = 0.01
    """How long static and dynamic batching wait to fill a batch, in seconds."""
    max_num_batched_tokens: int = 2048
    """Most tokens computed in one continuous-batching step."""
    chunked_prefill: bool = False
    """Split prompts across steps (continuous batching)."""

    @classmethod
    def from_manifest(cls, served: ServedModel) -> SchedulerConfig:
        """The scheduler configuration a manifest declares."""
        b = served.batching
        return cls(
            max_batch_size=1 if b.mode == "none" else b.max_batch_size,
            max_wait_s=b.max_wait_ms / 1000.0,
            max_num_batched_tokens=b.max_num_batched_tokens,
            chunked_prefill=b.chunked_prefill,
        )


class Scheduler(abc.ABC):
    """Base of the per-mode schedulers: queues, admission bookkeeping, update and finish."""

    mode: ClassVar[str]

    def __init__(self, config: SchedulerConfig, block_manager: KVBlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        """Sequences waiting for blocks: preempted ones at the front, new ones in arrival order."""
        self.running: list[Sequence] = []
        """Sequences holding blocks, oldest admission first (the youngest is preempted first)."""
        self.num_preemptions = 0

    # --- queue ---------------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence."""
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def num_queued(self) -> int:
        """Sequences waiting that were never scheduled: the queue the failure policy bounds."""
        return sum(1 for s in self.waiting if not s.started)

    def oldest_queued(self) -> Sequence | None:
        """The earliest arrival among never-scheduled waiting sequences (shed first under shed-oldest)."""
        queued = [s for s in self.waiting if not s.started]
        return min(queued, key=lambda s: s.arrival_time) if queued else None

    def has_unfinished(self) -> bool:
        """Whether any sequence is waiting or running."""
        return bool(self.waiting or self.running)

    # --- step ----------------------------------------------------------------------------------

    @abc.abstractmethod
    def schedule(self, now: float) -> SchedulerOutput:
        """Decide the next step."""

    def update(self, output: SchedulerOutput, sampled: Mapping[int, int]) -> list[Sequence]:
        """Apply a finished step: advance computed tokens, publish full blocks, append sampled tokens.

        `sampled` maps seq_id -> the token sampled from that chunk's logits (only chunks with
        samples=True). Returns the sequences that received a token, in chunk order.
        """
        grown: list[Sequence] = []
        for chunk in output.chunks:
            seq = self._by_id(chunk.seq_id)
            if seq is None:  # finished between schedule and update (never happens inside the engine loop)
                continue
            seq.num_computed_tokens += chunk.num_tokens
            self.block_manager.cache_full_blocks(seq)
            if chunk.samples:
                seq.output_token_ids.append(int(sampled[chunk.seq_id]))
                grown.append(seq)
        return grown

    def finish(self, seq: Sequence) -> None:
        """Take a sequence out (done, failed or aborted) and release its blocks."""
        if seq.status is SeqStatus.FINISHED:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        """Free a finished sequence's blocks (static batching holds them until its batch ends)."""
        self.block_manager.free(seq)

    # --- helpers shared by the modes -----------------------------------------------------------

    def _by_id(self, seq_id: int) -> Sequence | None:
        for seq in self.running:
            if seq.seq_id == seq_id:
                return seq
        return None

    def _admit(self, seq: Sequence, now: float) -> None:
        """Move a sequence (already given its blocks) from waiting to running."""
        self.waiting.remove(seq)
        seq.status = SeqStatus.RUNNING
        seq.started = True
        seq.admitted_at = now
        self.running.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Preempt by recompute: free the blocks, keep the tokens, wait at the front of the queue."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _chunk(self, seq: Sequence, num_tokens: int) -> ScheduledChunk:
        """The plan entry, with its runner input, for num_tokens of seq starting at its computed tokens."""
        start = seq.num_computed_tokens
        end = start + num_tokens
        blocks = self.block_manager.blocks_for_tokens(end)
        model_input = SeqChunk(seq.seq_id, tuple(seq.token_ids[start:end]), start, tuple(seq.block_table[:blocks]))
        return ScheduledChunk(seq.seq_id, num_tokens, start, samples=end == seq.num_tokens, model_input=model_input)

    @staticmethod
    def _output(
        chunks: list[ScheduledChunk],
        *,
        admitted: Iterable[Sequence] = (),
        preempted: Iterable[Sequence] = (),
        rejected: Iterable[Sequence] = (),
        wake_at: float | None = None,
        padded_slots: int = 0,
    ) -> SchedulerOutput:
        admitted = list(admitted)
        return SchedulerOutput(
            chunks=tuple(chunks),
            admitted=tuple(s.seq_id for s in admitted),
            preempted=tuple(s.seq_id for s in preempted),
            num_batched_tokens=sum(c.num_tokens for c in chunks),
            num_cached_tokens=sum(s.num_cached_tokens for s in admitted),
            padded_slots=padded_slots,
            wake_at=wake_at,
            rejected=tuple(s.seq_id for s in rejected),
        )
