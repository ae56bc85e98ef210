"""The paged KV cache's bookkeeping: which block holds which tokens, who shares it, what may be evicted.

The tensors live in the model runner; this module only hands out block ids. Protocol, used by every
scheduler:

    can_allocate(seq, n) / allocate(seq, n)   a sequence that holds no blocks: attach its cached prefix,
                                              then fresh blocks for its next n tokens
    can_append(seq, n)  / append_slot(seq, n) grow a running sequence's table to hold n more tokens
    cache_full_blocks(seq)                    after a step: publish blocks that just became full
    free(seq)                                 drop the sequence's references (preemption or finish)

Placement: a sequence's fresh blocks are laid out consecutively where the pool allows (its first block starts
a free run long enough for the whole sequence, the rest of the run is held for its growth, and a hold yields
to any allocation that finds no other free block), so the runner reads a context as a view of the pool.

Prefix caching keys every FULL block by a hash chain, h_i = H(h_{i-1}, tokens of block i), with h_{-1}
derived from a salt (the tenant unless cache_scope is global), so a block is reused only after the
very same tokens in the very same positions, and never across tenants. A block nobody references keeps
its hash and stays findable until it is evicted, least recently freed first.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from servegate.contracts.errors import ServegateError
from servegate.runtime.model.kv_memory import DTYPE_BYTES, KVDims, num_kv_blocks

if TYPE_CHECKING:
    from servegate.contracts.manifest import ServedModel
    from servegate.runtime.scheduling.sequence import Sequence


@dataclass(frozen=True)
class KVBlockCounters:
    """Prefix-cache and pool counters (blocks, not tokens)."""

    hits: int
    """Full prompt blocks found in the prefix cache at admission."""
    misses: int
    """Full prompt blocks looked up and not found."""
    evictions: int
    """Cached blocks whose contents were dropped to make room."""
    used: int
    """Blocks referenced by at least one sequence."""
    free: int
    """Blocks available to allocate (cached-but-unreferenced ones included)."""


def blocks_for_budget(memory_budget: int, block_size: int, dims: KVDims, kv_dtype: str) -> int:
    """Blocks that fit in `memory_budget` bytes for a model of KV shape `dims` stored in `kv_dtype`."""
    return num_kv_blocks(memory_budget, block_size, dims.bytes_per_token(DTYPE_BYTES[kv_dtype]))


def _chain_hash(parent: bytes, token_ids: list[int]) -> bytes:
    return hashlib.blake2b(parent + np.asarray(token_ids, dtype=np.int64).tobytes(), digest_size=16).digest()


def _root_hash(salt: str) -> bytes:
    return hashlib.blake2b(b"servegate-kv\0" + salt.encode("utf-8"), digest_size=16).digest()


class KVBlockManager:
    """Hands out KV block ids, shares full blocks of identical prefixes, evicts unreferenced ones LRU."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a KV pool needs >= 1 block of >= 1 token (got {num_blocks} x {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._refs = [0] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks
        self._block_of: dict[bytes, int] = {}
        # Free blocks come in two pools: never-hashed ones (taken first) and unreferenced cached ones,
        # ordered least recently freed first; taking one of those evicts its contents.
        self._plain_free = np.ones(num_blocks, dtype=bool)
        self._num_plain_free = num_blocks
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        # Placement: each sequence's fresh blocks are laid out consecutively where the pool allows, so the
        # runner reads its context as a view of the pool instead of gathering it block by block every layer
        # of every step (benchmarks/README.md, "Packed weights and consecutive blocks"). A sequence's first
        # fresh block starts a free run long enough for the whole sequence, and the rest of that run is held for
        # its growth: a soft hold, which other sequences take only when no other plain block is free, so it
        # never costs capacity.
        self._held_by = np.full(num_blocks, -1, dtype=np.int64)
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    # --- pool state ----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be allocated now (evicting cached ones if needed)."""
        return self._num_plain_free + len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - self.num_free_blocks

    def counters(self) -> KVBlockCounters:
        """Current hits, misses, evictions and used/free blocks."""
        return KVBlockCounters(self.hits, self.misses, self.evictions, self.num_used_blocks, self.num_free_blocks)

    def ref_count(self, block_id: int) -> int:
        """How many sequences reference the block (tests and invariants)."""
        return self._refs[block_id]

    def blocks_for_tokens(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` positions."""
        return math.ceil(num_tokens / self.block_size)

    # --- prefix cache ---------------------------------------------------------------------------

    def _extend_hashes(self, seq: Sequence) -> list[bytes]:
        """seq.block_hashes for every full block of its known tokens (computed once, then extended)."""
        full = seq.num_tokens // self.block_size
        if len(seq.block_hashes) < full:
            tokens = seq.token_ids
            parent = seq.block_hashes[-1] if seq.block_hashes else _root_hash(seq.cache_salt)
            for i in range(len(seq.block_hashes), full):
                parent = _chain_hash(parent, tokens[i * self.block_size : (i + 1) * self.block_size])
                seq.block_hashes.append(parent)
        return seq.block_hashes

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix, leaving at least one token to compute (its logits are needed)."""
        if not self.prefix_caching:
            return []
        limit = (seq.num_tokens - 1) // self.block_size
        found: list[int] = []
        for block_hash in self._extend_hashes(seq)[:limit]:
            block_id = self._block_of.get(block_hash)
            if block_id is None:
                break
            found.append(block_id)
        return found

    def num_cached_tokens(self, seq: Sequence) -> int:
        """Tokens of a not-yet-allocated sequence that the prefix cache already holds (no side effects)."""
        return len(self._cached_prefix(seq)) * self.block_size

    # --- allocation -----------------------------------------------------------------------------

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether a sequence holding no blocks can get its cached prefix plus room for num_new_tokens."""
        prefix = self._cached_prefix(seq)
        reused_free = sum(1 for b in prefix if self._refs[b] == 0)
        fresh = self.blocks_for_tokens(len(prefix) * self.block_size + num_new_tokens) - len(prefix)
        return fresh + reused_free <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> int:
        """Attach the cached prefix and fresh blocks for num_new_tokens; returns the prefix-hit tokens.

        Sets seq.num_computed_tokens to the hit tokens. Raises RuntimeError when can_allocate is False.
        """
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.seq_id} already holds blocks: use append_slot")
        if not self.can_allocate(seq, num_new_tokens):
            raise RuntimeError(f"not enough free KV blocks for sequence {seq.seq_id}")
        prefix = self._cached_prefix(seq)
        if self.prefix_caching:
            eligible = min((seq.num_tokens - 1) // self.block_size, len(self._extend_hashes(seq)))
            self.hits += len(prefix)
            self.misses += eligible - len(prefix)
        for block_id in prefix:
            if self._refs[block_id] == 0:
                del self._free_cached[block_id]
            self._refs[block_id] += 1
        seq.block_table = list(prefix)
        seq.num_hashed_blocks = len(prefix)
        seq.num_computed_tokens = seq.num_cached_tokens = len(prefix) * self.block_size
        self._grow(seq, seq.num_computed_tokens + num_new_tokens)
        return seq.num_cached_tokens

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Whether the free pool covers the blocks a running sequence needs for num_new_tokens more."""
        needed = self.blocks_for_tokens(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return needed <= self.num_free_blocks

    def append_slot(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        """Grow the sequence's block table to hold num_new_tokens beyond its computed ones."""
        if not self.can_append(seq, num_new_tokens):
            raise RuntimeError(f"not enough free KV blocks to extend sequence {seq.seq_id}")
        self._grow(seq, seq.num_computed_tokens + num_new_tokens)

    def reserve(self, seq: Sequence, num_tokens: int) -> None:
        """Grow an allocated sequence's table to hold num_tokens positions in all (request-level batching)."""
        needed = self.blocks_for_tokens(num_tokens) - len(seq.block_table)
        if needed > self.num_free_blocks:
            raise RuntimeError(f"not enough free KV blocks to reserve {num_tokens} tokens for sequence {seq.seq_id}")
        self._grow(seq, num_tokens)

    def _grow(self, seq: Sequence, num_tokens: int) -> None:
        for _ in range(self.blocks_for_tokens(num_tokens) - len(seq.block_table)):
            seq.block_table.append(self._take_free(seq))

    def _placed(self, seq: Sequence) -> int | None:
        """The plain block that keeps `seq`'s fresh blocks consecutive, or None when there is none to take.

        Growing: the block after its last one, when free and not held for another sequence. First block: the
        start of the first free, unheld run that holds the whole sequence (else of the longest such run), whose
        remaining blocks are then held for it. (A table that starts with a cached prefix grows after it.)
        """
        if seq.block_table:
            after = seq.block_table[-1] + 1
            if after < self.num_blocks and self._plain_free[after] and self._held_by[after] in (-1, seq.seq_id):
                return after
            return None
        free = self._unheld_free()
        if not free.any():
            return None
        want = self.blocks_for_tokens(seq.max_total_tokens)
        edges = np.flatnonzero(np.diff(np.concatenate(([False], free, [False])).astype(np.int8)))
        starts, lengths = edges[0::2], edges[1::2] - edges[0::2]
        fits = np.flatnonzero(lengths >= want)
        run = int(fits[0]) if fits.size else int(np.argmax(lengths))
        start, hold = int(starts[run]), min(want, int(lengths[run]))
        self._held_by[start + 1 : start + hold] = seq.seq_id
        return start

    def _unheld_free(self) -> np.ndarray:
        """Mask of the plain free blocks no sequence holds."""
        return self._plain_free & (self._held_by < 0)

    def _take_free(self, seq: Sequence) -> int:
        block_id = self._placed(seq) if self._num_plain_free else None
        if block_id is None and self._num_plain_free:
            # lowest unheld plain block, else a held one (the hold is only a preference)
            unheld = np.flatnonzero(self._unheld_free())
            block_id = int(unheld[0]) if unheld.size else int(np.flatnonzero(self._plain_free)[0])
        if block_id is not None:
            self._plain_free[block_id] = False
            self._held_by[block_id] = -1
            self._num_plain_free -= 1
        else:
            block_id, _ = self._free_cached.popitem(last=False)
            stale = self._hash_of[block_id]
            if stale is not None and self._block_of.get(stale) == block_id:
                del self._block_of[stale]
            self._hash_of[block_id] = None
            self.evictions += 1
        self._refs[block_id] = 1
        return block_id

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Publish the sequence's blocks that are now full of computed K/V to the prefix cache."""
        if not self.prefix_caching:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if full <= seq.num_hashed_blocks:
            return
        hashes = self._extend_hashes(seq)
        for i in range(seq.num_hashed_blocks, full):
            block_id = seq.block_table[i]
            # Another block may already hold these tokens (computed twice concurrently): keep the first.
            if hashes[i] not in self._block_of and self._hash_of[block_id] is None:
                self._block_of[hashes[i]] = block_id
                self._hash_of[block_id] = hashes[i]
        seq.num_hashed_blocks = full

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's block references; cached blocks stay findable until evicted."""
        # Tail first, so that under LRU a prefix's last blocks are evicted before its first ones.
        for block_id in reversed(seq.block_table):
            self._refs[block_id] -= 1
            if self._refs[block_id] < 0:
                raise RuntimeError(f"KV block {block_id} freed more often than allocated")
            if self._refs[block_id] == 0:
                if self._hash_of[block_id] is not None:
                    self._free_cached[block_id] = None
                else:
                    self._plain_free[block_id] = True
                    self._num_plain_free += 1
        self._held_by[self._held_by == seq.seq_id] = -1
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_hashed_blocks = 0


def pool_size(served: ServedModel, dims: KVDims, compute_dtype: str) -> tuple[int, int]:
    """(num_blocks, block_size) of the KV pool a manifest asks for.

    With runtime.kv_cache the blocks follow from its memory_budget; without one (request-level modes),
    the pool holds max_batch_size sequences of max_model_len tokens, so a full batch never waits on memory.
    """
    kv = served.runtime.kv_cache
    max_len = served.runtime.max_model_len
    if kv is None:
        block_size = 16
        slots = 1 if served.batching.mode == "none" else served.batching.max_batch_size
        return slots * math.ceil(max_len / block_size), block_size
    kv_dtype = "fp8" if kv.dtype == "fp8" else compute_dtype
    num_blocks = blocks_for_budget(kv.memory_budget, kv.block_size, dims, kv_dtype)
    if num_blocks * kv.block_size < max_len:
        per_token = dims.bytes_per_token(DTYPE_BYTES[kv_dtype])
        raise ServegateError(
            f"runtime.kv_cache.memory_budget ({kv.memory_budget} bytes) holds {num_blocks} blocks of "
            f"{kv.block_size} tokens = {num_blocks * kv.block_size} tokens, fewer than runtime.max_model_len "
            f"({max_len}); one sequence needs {math.ceil(max_len / kv.block_size) * kv.block_size * per_token} "
            "bytes: raise memory_budget or lower max_model_len"
        )
    return num_blocks, kv.block_size
