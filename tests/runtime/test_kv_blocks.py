"""KV block manager: sizing, the allocate/append/free protocol, prefix caching, tenant salt, LRU eviction."""

from __future__ import annotations

import pytest

from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.model.kv_memory import KVDims
from servegate.runtime.scheduling import Sequence
from servegate.runtime.scheduling.kv_blocks import KVBlockManager, blocks_for_budget, pool_size


def seq(seq_id: int, prompt: list[int], salt: str = "", max_tokens: int = 4) -> Sequence:
    return Sequence(seq_id, list(prompt), max_tokens, cache_salt=salt)


def compute(bm: KVBlockManager, s: Sequence, n: int) -> None:
    """Pretend the model computed n more tokens of s (what the scheduler's update does)."""
    s.num_computed_tokens += n
    bm.cache_full_blocks(s)


def manifest(**sections: object) -> ServedModel:
    return ServedModel.model_validate({"name": "m", "weights": {"source": "zoo:tiny-primary"}, **sections})


def test_blocks_follow_the_memory_budget_and_kv_bytes_per_token() -> None:
    dims = KVDims(num_layers=2, num_kv_heads=4, head_dim=8)
    per_token = 2 * 2 * 4 * 8 * 4  # K and V x layers x kv_heads x head_dim x float32 bytes
    assert blocks_for_budget(10 * 16 * per_token, 16, dims, "float32") == 10
    assert blocks_for_budget(10 * 16 * per_token, 16, dims, "bfloat16") == 20
    served = manifest(
        runtime={"max_model_len": 64, "kv_cache": {"block_size": 16, "memory_budget": 10 * 16 * per_token}},
        preprocess={"max_input_tokens": 32},
        postprocess={"max_output_tokens": 32},
    )
    assert pool_size(served, dims, "float32") == (10, 16)


def test_without_a_kv_cache_the_pool_holds_a_full_batch_of_max_model_len() -> None:
    served = manifest(
        runtime={"max_model_len": 100},
        batching={"mode": "static", "max_batch_size": 3},
        preprocess={"max_input_tokens": 50},
        postprocess={"max_output_tokens": 50},
    )
    num_blocks, block_size = pool_size(served, KVDims(2, 4, 8), "float32")
    assert num_blocks * block_size >= 3 * 100
    assert (num_blocks - 3) * block_size < 3 * 100


def test_a_budget_smaller_than_one_sequence_is_refused_with_the_fix() -> None:
    served = manifest(
        runtime={"max_model_len": 64, "kv_cache": {"block_size": 16, "memory_budget": 4096}},
        preprocess={"max_input_tokens": 32},
        postprocess={"max_output_tokens": 32},
    )
    with pytest.raises(ServegateError, match="raise memory_budget or lower max_model_len"):
        pool_size(served, KVDims(2, 4, 8), "float32")


def test_allocate_append_free_move_blocks_between_used_and_free() -> None:
    bm = KVBlockManager(8, 4)
    a = seq(0, list(range(10, 20)))  # 10 tokens -> 3 blocks
    assert bm.can_allocate(a, 10)
    assert bm.allocate(a, 10) == 0
    assert len(a.block_table) == 3 and bm.num_used_blocks == 3 and bm.num_free_blocks == 5
    compute(bm, a, 10)
    a.output_token_ids += [1, 2]  # 12 tokens: still 3 blocks
    bm.append_slot(a, 2)
    assert len(a.block_table) == 3
    a.output_token_ids.append(3)
    compute(bm, a, 2)
    bm.append_slot(a, 1)  # position 12 opens a fourth block
    assert len(a.block_table) == 4
    assert bm.can_append(a, 20) and not bm.can_append(a, 21)  # 4 free blocks = 16 more positions after 16
    bm.free(a)
    assert a.block_table == [] and bm.num_free_blocks == 8
    assert bm.counters().used == 0


def test_can_allocate_is_false_when_the_pool_is_short_and_allocate_refuses() -> None:
    bm = KVBlockManager(2, 4)
    big = seq(0, list(range(4, 13)))  # 9 tokens -> 3 blocks
    assert not bm.can_allocate(big, 9)
    with pytest.raises(RuntimeError):
        bm.allocate(big, 9)
    assert bm.num_free_blocks == 2


def test_prefix_hits_reuse_full_blocks_and_leave_a_token_to_compute() -> None:
    bm = KVBlockManager(16, 4, prefix_caching=True)
    prompt = list(range(4, 14))  # 10 tokens: 2 full blocks + 2
    first = seq(0, prompt)
    bm.allocate(first, 10)
    compute(bm, first, 10)
    bm.free(first)
    second = seq(1, prompt + [50, 51])
    assert bm.num_cached_tokens(second) == 8
    assert bm.allocate(second, 4) == 8
    assert second.num_computed_tokens == 8
    assert bm.counters().hits == 2
    # a prompt made of exactly the cached full blocks still computes its last block (its logits are needed)
    exact = seq(2, prompt[:8])
    assert bm.num_cached_tokens(exact) == 4


def test_shared_blocks_are_reference_counted() -> None:
    bm = KVBlockManager(16, 4, prefix_caching=True)
    prompt = list(range(4, 13))
    a = seq(0, prompt)
    bm.allocate(a, 9)
    compute(bm, a, 9)
    b = seq(1, prompt)
    bm.allocate(b, 1)
    assert a.block_table[:2] == b.block_table[:2]
    assert [bm.ref_count(x) for x in a.block_table[:2]] == [2, 2]
    assert b.block_table[2] != a.block_table[2]  # the partial last block is never shared
    bm.free(a)
    assert [bm.ref_count(x) for x in b.block_table[:2]] == [1, 1]


def test_the_hash_chain_needs_the_same_tokens_in_the_same_positions() -> None:
    bm = KVBlockManager(16, 4, prefix_caching=True)
    a = seq(0, [4, 5, 6, 7, 8, 9, 10, 11, 12])
    bm.allocate(a, 9)
    compute(bm, a, 9)
    bm.free(a)
    # the second block's tokens behind a different first block: no hit at all
    b = seq(1, [30, 31, 32, 33, 8, 9, 10, 11, 12])
    assert bm.num_cached_tokens(b) == 0


def test_prefix_cache_is_salted_with_the_tenant() -> None:
    bm = KVBlockManager(16, 4, prefix_caching=True)
    prompt = list(range(4, 13))
    a = seq(0, prompt, salt="tenant-a")
    bm.allocate(a, 9)
    compute(bm, a, 9)
    bm.free(a)
    assert bm.num_cached_tokens(seq(1, prompt, salt="tenant-b")) == 0
    assert bm.num_cached_tokens(seq(2, prompt, salt="tenant-a")) == 8
    misses_before = bm.misses
    bm.allocate(seq(3, prompt, salt="tenant-b"), 9)
    assert bm.misses == misses_before + 2


def test_unreferenced_cached_blocks_are_evicted_least_recently_freed_first() -> None:
    bm = KVBlockManager(4, 4, prefix_caching=True)
    old, new = seq(0, [4, 5, 6, 7, 8]), seq(1, [9, 10, 11, 12, 13])
    for s in (old, new):
        bm.allocate(s, 5)
        compute(bm, s, 5)
        bm.free(s)
    assert bm.num_free_blocks == 4
    filler = seq(2, [20, 21, 22])  # takes the 2 never-hashed blocks... and must then evict
    bm.allocate(filler, 3)
    other = seq(3, [30, 31, 32, 33, 34, 35])
    bm.allocate(other, 6)  # 2 blocks: 1 plain + 1 eviction (the oldest cached one)
    assert bm.evictions == 1
    assert bm.num_cached_tokens(seq(4, [4, 5, 6, 7, 8])) == 0
    assert bm.num_cached_tokens(seq(5, [9, 10, 11, 12, 13])) == 4


def test_a_cached_block_taken_while_unreferenced_leaves_the_free_pool() -> None:
    bm = KVBlockManager(3, 4, prefix_caching=True)
    a = seq(0, [4, 5, 6, 7, 8])
    bm.allocate(a, 5)
    compute(bm, a, 5)
    bm.free(a)
    b = seq(1, [4, 5, 6, 7, 9])
    assert bm.can_allocate(b, 1)
    bm.allocate(b, 1)
    assert bm.num_free_blocks == 1 and bm.ref_count(b.block_table[0]) == 1
    assert bm.evictions == 0


def consecutive(table: list[int]) -> bool:
    return table == list(range(table[0], table[0] + len(table)))


def test_sequences_growing_in_turn_keep_consecutive_blocks() -> None:
    # block 4: each sequence's prompt takes 2 blocks, its 8 output tokens 2 more; they grow interleaved
    bm = KVBlockManager(num_blocks=32, block_size=4)
    seqs = [seq(i, list(range(10 * i, 10 * i + 8)), max_tokens=8) for i in range(4)]
    for s in seqs:
        bm.allocate(s, 8)
        compute(bm, s, 8)
    for _ in range(8):  # one decode step of every sequence at a time, as continuous batching runs them
        for s in seqs:
            bm.append_slot(s, 1)
            compute(bm, s, 1)
            s.output_token_ids.append(1)
    for s in seqs:
        assert len(s.block_table) == 4 and consecutive(s.block_table), s.block_table
    assert len({b for s in seqs for b in s.block_table}) == 16


def test_held_blocks_never_cost_capacity() -> None:
    # two sequences that each may grow to 8 blocks hold the whole pool; a third still gets every free block
    bm = KVBlockManager(num_blocks=16, block_size=4)
    a, b = seq(0, [1] * 4, max_tokens=28), seq(1, [2] * 4, max_tokens=28)
    bm.allocate(a, 4)
    bm.allocate(b, 4)
    assert bm.num_free_blocks == 14
    c = seq(2, [3] * 4, max_tokens=52)
    assert bm.can_allocate(c, 56)
    bm.allocate(c, 56)  # takes blocks held for a and b: a hold is a preference, not a reservation
    assert bm.num_free_blocks == 0 and len(set(c.block_table)) == 14
    assert not set(c.block_table) & (set(a.block_table) | set(b.block_table))


def test_a_freed_sequence_releases_its_hold() -> None:
    bm = KVBlockManager(num_blocks=8, block_size=4)
    a = seq(0, [1] * 4, max_tokens=12)  # 4 blocks: 1 taken, 3 held
    bm.allocate(a, 4)
    bm.free(a)
    b = seq(1, [2] * 4, max_tokens=28)  # wants all 8: the run is whole again
    bm.allocate(b, 4)
    compute(bm, b, 4)
    assert b.block_table == [0]
    for _ in range(7):
        bm.append_slot(b, 4)
        compute(bm, b, 4)
    assert b.block_table == list(range(8))


def test_a_new_sequence_is_placed_past_anothers_room_to_grow() -> None:
    bm = KVBlockManager(num_blocks=16, block_size=4)
    a, b = seq(0, [1] * 4, max_tokens=12), seq(1, [2] * 4, max_tokens=12)
    bm.allocate(a, 4)
    bm.allocate(b, 4)
    assert a.block_table == [0] and b.block_table == [4]  # blocks 1-3 are a's to grow into
