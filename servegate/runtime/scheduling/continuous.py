"""Batching mode `continuous`: iteration-level scheduling over paged KV blocks."""

from __future__ import annotations

from servegate.runtime.scheduling.base import Scheduler
from servegate.runtime.scheduling.output import ScheduledChunk, SchedulerOutput
from servegate.runtime.scheduling.sequence import Sequence


class ContinuousScheduler(Scheduler):
    """Admits and retires sequences at every step; preempts the youngest by recompute when blocks run out."""

    mode = "continuous"

    def schedule(self, now: float) -> SchedulerOutput:
        """Plan one step.

        The algorithm. There is no prefill phase and no decode phase: every sequence has
        num_computed_tokens (K/V already in its blocks) catching up with num_tokens (prompt + output),
        and each step gives some sequences some of their remaining tokens. A fresh prompt, a prefill
        chunk, a recompute after preemption and a one-token decode are all the same thing. A chunk
        that reaches the last token yields logits, hence the sequence's next token.

        1. Running sequences, oldest admission first. Each is given min(remaining, token budget)
           tokens (1 for a decode; the rest of its prompt when a prefill was chunked). When the pool
           cannot hold them, the youngest running sequence is preempted: its blocks are freed, its
           tokens kept, and it waits at the head of the queue to be recomputed. If the youngest is
           the sequence itself, it is preempted and the pass ends (everything younger is gone).
        2. Waiting sequences, in queue order (preempted first, then arrivals), unless step 1
           preempted: admitted while fewer than max_batch_size run, the token budget lasts and the
           pool holds their cached prefix plus the tokens they are given. A prefix-cache hit counts
           as computed. Without chunked prefill a prompt is admitted only whole (the queue does not
           overtake: admission stops at the first that does not fit), except one longer than
           max_num_batched_tokens on its own, which could not be scheduled otherwise (a long
           sequence recomputed after preemption).
        3. Sequences that finish during the step are removed by the engine right after it
           (finish()), so their blocks serve the next step.
        """
        cfg, bm = self.config, self.block_manager
        budget = cfg.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[Sequence] = []
        admitted: list[Sequence] = []

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_remaining, budget)
            while not bm.can_append(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq in preempted:
                break
            bm.append_slot(seq, num_new)
            chunks.append(self._chunk(seq, num_new))
            budget -= num_new
            i += 1

        rejected: list[Sequence] = []
        while not preempted and self.waiting and len(self.running) < cfg.max_batch_size and budget > 0:
            seq = self.waiting[0]
            num_new = seq.num_tokens - bm.num_cached_tokens(seq)
            if num_new > budget:
                if not (cfg.chunked_prefill or num_new > cfg.max_num_batched_tokens):
                    break
                num_new = budget
            if not bm.can_allocate(seq, num_new):
                if not self.running:  # the pool is all free and still too small: it can never run
                    self.finish(seq)
                    rejected.append(seq)
                    continue
                break
            bm.allocate(seq, num_new)
            self._admit(seq, now)
            admitted.append(seq)
            chunks.append(self._chunk(seq, num_new))
            budget -= num_new
        return self._output(chunks, admitted=admitted, preempted=preempted, rejected=rejected)
