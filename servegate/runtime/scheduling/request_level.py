"""Request-level batching (modes none, static, dynamic): a batch runs to completion before the next starts.

Every member reserves blocks for its prompt plus its most output tokens when the batch starts, so a
running batch never runs out of memory and nothing is ever preempted. No request joins a batch in
flight. The modes differ only in when a batch starts and whether a finished member's slot is held.
"""

from __future__ import annotations

from typing import Any

from servegate.runtime.scheduling.base import Scheduler
from servegate.runtime.scheduling.output import SchedulerOutput
from servegate.runtime.scheduling.sequence import Sequence


class RequestLevelScheduler(Scheduler):
    """Runs one batch at a time to completion; subclasses say when a batch may start."""

    hold_finished_slots = False
    """True for static batching: finished members keep their slot and blocks until the batch ends."""
    waits_to_fill = False
    """True for static and dynamic batching: a batch waits up to max_wait_s for max_batch_size members."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch: list[Sequence] = []
        """Members of the batch in flight, finished ones included."""
        self._held: list[Sequence] = []

    def start_time(self, now: float) -> float:
        """When the next batch may start (the previous one has ended and someone waits).

        Without waiting to fill: now. Otherwise now when a full batch waits, else when the oldest
        waiting request has waited max_wait_s (requests that queued behind a long batch start at once).
        """
        if not self.waits_to_fill or len(self.waiting) >= self.config.max_batch_size:
            return now
        return min(seq.arrival_time for seq in self.waiting) + self.config.max_wait_s

    def schedule(self, now: float) -> SchedulerOutput:
        """Start a batch when none is in flight and the mode's rule allows; compute every live member.

        A member's first step computes its whole prompt; each later step computes its one new token.
        """
        admitted: list[Sequence] = []
        rejected: list[Sequence] = []
        wake_at = None
        if not self.running:
            if self.waiting:
                start = self.start_time(now)
                if start <= now:
                    admitted, rejected = self._start_batch(now)
                else:
                    wake_at = start
        chunks = [self._chunk(seq, seq.num_remaining) for seq in self.running]
        padded = self.config.max_batch_size - len(chunks) if self.hold_finished_slots and chunks else 0
        return self._output(chunks, admitted=admitted, rejected=rejected, wake_at=wake_at, padded_slots=padded)

    def _start_batch(self, now: float) -> tuple[list[Sequence], list[Sequence]]:
        """Admit up to max_batch_size waiting sequences, first come first served, while memory lasts."""
        bm = self.block_manager
        admitted: list[Sequence] = []
        rejected: list[Sequence] = []
        for seq in list(self.waiting)[: self.config.max_batch_size]:
            if bm.blocks_for_tokens(seq.max_total_tokens) > bm.num_free_blocks:
                if not admitted and bm.num_used_blocks == 0:  # more than the whole pool: can never run
                    self.finish(seq)
                    rejected.append(seq)
                    continue
                break
            bm.allocate(seq, seq.num_remaining)
            bm.reserve(seq, seq.max_total_tokens)
            self._admit(seq, now)
            admitted.append(seq)
        self.batch = list(admitted)
        return admitted, rejected

    def finish(self, seq: Sequence) -> None:
        """Take a sequence out; the batch ends (held slots are released) when its last member is done."""
        super().finish(seq)
        if not self.running:
            self._end_batch()

    def _release(self, seq: Sequence) -> None:
        if self.hold_finished_slots and seq in self.batch:
            self._held.append(seq)  # padded semantics: the slot and its memory stay with the batch
        else:
            self.block_manager.free(seq)

    def _end_batch(self) -> None:
        for seq in self._held:
            self.block_manager.free(seq)
        self._held = []
        self.batch = []
