"""A request's tokens as the scheduler and the KV block manager see them.

Invariant (no prefill or decode phase, as in vLLM v1): a sequence has `token_ids` (prompt + output so
far) and `num_computed_tokens` (tokens whose K/V already sit in its blocks). Each step computes some of
the remaining tokens; when a step reaches the last token, the model's logits there give the next token.
A decode is simply the case of one remaining token; a preempted sequence starts again from zero (or from
its cached prefix) and recomputes prompt and output alike.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class SeqStatus(enum.Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    """Queued: never scheduled yet, or preempted and waiting to be recomputed."""
    RUNNING = "running"
    """Holds KV blocks and is scheduled each step."""
    FINISHED = "finished"
    """Done (or aborted); its blocks are free."""


@dataclass(eq=False)
class Sequence:
    """One request's token state; the engine keeps everything else (text, sinks) beside it."""

    seq_id: int
    prompt_token_ids: list[int]
    max_tokens: int
    """Most output tokens (already capped by max_output_tokens and max_model_len)."""
    arrival_time: float = 0.0
    """time.monotonic() at arrival; orders the queue."""
    cache_salt: str = ""
    """Salt of the prefix-cache hash chain: the tenant, or "" when the cache is global."""
    request_id: str = ""
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    """Tokens whose K/V is in the cache (prefix-cache hits included)."""
    block_table: list[int] = field(default_factory=list)
    """KV block ids covering the sequence's positions, in order."""
    block_hashes: list[bytes] = field(default_factory=list)
    """Hash chain over the full blocks of token_ids (block i's hash covers tokens [0, (i+1) * block_size))."""
    num_hashed_blocks: int = 0
    """Blocks of block_table already published to (or taken from) the prefix cache."""
    num_cached_tokens: int = 0
    """Prefix-cache hit tokens at the latest admission."""
    status: SeqStatus = SeqStatus.WAITING
    started: bool = False
    """Scheduled at least once (a preempted sequence is started; a queued one is not)."""
    num_preemptions: int = 0
    admitted_at: float | None = None
    """time.monotonic() of the latest admission (static and dynamic batches record their start)."""

    @property
    def token_ids(self) -> list[int]:
        """Prompt followed by the output so far."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        """len(prompt) + len(output)."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length in tokens."""
        return len(self.prompt_token_ids)

    @property
    def num_remaining(self) -> int:
        """Tokens not yet computed (1 for a decode, the prompt for a fresh prefill)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def max_total_tokens(self) -> int:
        """Prompt + the most output tokens: the length the sequence can reach."""
        return len(self.prompt_token_ids) + self.max_tokens
