"""Continuous (and offline) scheduling with factories and a toy paged model: no weights needed."""

from __future__ import annotations

import pytest
from runtime_factories import (
    ToyRunner,
    create_scheduler,
    create_sequences,
    drive,
    reference_outputs,
)

from servegate.runtime.scheduling import Sequence


def test_admission_stops_at_max_batch_size() -> None:
    sched = create_scheduler(max_batch_size=3, max_num_batched_tokens=1000)
    for s in create_sequences(5, prompt_lens=(4, 4)):
        sched.add(s)
    plan = sched.schedule(0.0)
    assert plan.admitted == (0, 1, 2)
    assert [c.num_tokens for c in plan.chunks] == [4, 4, 4]
    assert all(c.samples for c in plan.chunks)
    assert len(sched.waiting) == 2


def test_admission_stops_at_the_token_budget_without_overtaking() -> None:
    sched = create_scheduler(max_num_batched_tokens=10)
    for s in (Sequence(0, [5] * 6, 2), Sequence(1, [6] * 6, 2), Sequence(2, [7] * 2, 2)):
        sched.add(s)
    plan = sched.schedule(0.0)
    # 6 + 6 > 10 and the queue does not overtake: the short third prompt waits too
    assert plan.admitted == (0,) and plan.num_batched_tokens == 6


def test_running_decodes_go_first_then_new_prompts_fill_the_budget() -> None:
    sched = create_scheduler(max_num_batched_tokens=8)
    runner = ToyRunner(64, 4)
    sched.add(Sequence(0, [5] * 6, 5))
    plan = sched.schedule(0.0)
    runner.execute(plan.model_inputs)
    sched.update(plan, {0: 9})
    sched.add(Sequence(1, [6] * 7, 5))
    sched.add(Sequence(2, [7] * 3, 5))
    plan = sched.schedule(1.0)
    runner.execute(plan.model_inputs)
    assert [(c.seq_id, c.num_tokens, c.start_pos) for c in plan.chunks] == [(0, 1, 6), (1, 7, 0)]
    assert plan.num_batched_tokens == 8


def test_chunked_prefill_splits_a_long_prompt_while_decodes_continue() -> None:
    sched = create_scheduler(max_num_batched_tokens=8, chunked_prefill=True)
    sched.add(Sequence(0, [5] * 3, 10))
    plan = sched.schedule(0.0)
    sched.update(plan, {0: 9})
    sched.add(Sequence(1, list(range(4, 24)), 3))  # 20 tokens
    chunks = []
    for step in range(4):
        plan = sched.schedule(float(step))
        chunks.append([(c.seq_id, c.num_tokens, c.samples) for c in plan.chunks])
        sched.update(plan, {c.seq_id: 9 for c in plan.chunks if c.samples})
    assert chunks[0] == [(0, 1, True), (1, 7, False)]
    assert chunks[1] == [(0, 1, True), (1, 7, False)]
    assert chunks[2] == [(0, 1, True), (1, 6, True)]  # the last chunk reaches the end: it samples
    assert chunks[3] == [(0, 1, True), (1, 1, True)]


def test_without_chunking_a_sequence_longer_than_the_budget_still_runs_in_chunks() -> None:
    # e.g. a long sequence recomputed after preemption: it could never be scheduled whole
    sched = create_scheduler(max_num_batched_tokens=8)
    sched.add(Sequence(0, list(range(4, 24)), 2))
    plan = sched.schedule(0.0)
    assert [(c.num_tokens, c.samples) for c in plan.chunks] == [(8, False)]


def test_the_youngest_running_sequence_is_preempted_when_blocks_run_out() -> None:
    sched = create_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=100)
    old, young = Sequence(0, [5] * 8, 10, arrival_time=0.0), Sequence(1, [6] * 8, 10, arrival_time=1.0)
    sched.add(old)
    sched.add(young)
    plan = sched.schedule(0.0)
    assert plan.admitted == (0, 1)  # 2 blocks each: the pool is full
    sched.update(plan, {0: 9, 1: 9})
    plan = sched.schedule(1.0)  # both now need a third block for position 8
    assert plan.preempted == (1,)
    assert [c.seq_id for c in plan.chunks] == [0]
    assert young.num_computed_tokens == 0 and young.block_table == [] and young.output_token_ids == [9]
    assert sched.waiting[0] is young and young.started
    assert sched.num_queued() == 0  # a preempted sequence is not counted as queued


@pytest.mark.parametrize(
    ("num_blocks", "budget", "chunked", "prefix"),
    [
        (200, 64, False, False),
        (200, 16, True, False),
        (12, 64, False, False),  # forced preemption: 48 token slots for 40 requests
        (12, 7, True, True),
        (200, 64, False, True),
    ],
)
def test_outputs_equal_the_unbatched_reference(num_blocks: int, budget: int, chunked: bool, prefix: bool) -> None:
    shared = [7, 8, 9, 10, 11, 12, 13, 14, 15] if prefix else []
    seqs = create_sequences(40, prompt_lens=(1, 20), max_tokens=(1, 16), shared_prefix=shared, seed=num_blocks)
    sched = create_scheduler(
        num_blocks=num_blocks,
        block_size=4,
        max_batch_size=6,
        max_num_batched_tokens=budget,
        chunked_prefill=chunked,
        prefix_caching=prefix,
    )
    outputs, plans = drive(sched, seqs)
    assert outputs == reference_outputs(seqs)
    assert all(p.num_batched_tokens <= max(budget, 1) for p in plans)
    assert all(len(p.chunks) <= 6 for p in plans)
    if num_blocks == 12:
        assert sched.num_preemptions > 0
    if prefix:
        assert sum(p.num_cached_tokens for p in plans) > 0
        assert sched.block_manager.hits > 0
    assert sched.block_manager.num_used_blocks == 0


def test_finished_sequences_free_their_blocks_at_once() -> None:
    sched = create_scheduler(num_blocks=8, block_size=4)
    short, long_ = Sequence(0, [5] * 4, 1), Sequence(1, [6] * 4, 6)
    sched.add(short)
    sched.add(long_)
    plan = sched.schedule(0.0)
    for seq in sched.update(plan, {0: 9, 1: 9}):
        if seq is short:
            sched.finish(seq)
    assert sched.block_manager.num_used_blocks == 1 and short.block_table == []
    assert [s.seq_id for s in sched.running] == [1]


def test_prefix_cache_hits_are_reported_and_skip_computation() -> None:
    sched = create_scheduler(prefix_caching=True, block_size=4)
    prefix = list(range(4, 16))  # 3 full blocks
    outputs, _ = drive(sched, [Sequence(0, prefix + [20], 2)])
    second = Sequence(1, prefix + [21, 22], 2)
    sched.add(second)
    plan = sched.schedule(0.0)
    assert plan.num_cached_tokens == 12
    assert [(c.start_pos, c.num_tokens) for c in plan.chunks] == [(12, 2)]


def test_offline_mode_never_chunks_prompts() -> None:
    sched = create_scheduler("offline", max_num_batched_tokens=10, chunked_prefill=True)
    for s in (Sequence(0, [5] * 6, 2), Sequence(1, [6] * 6, 2)):
        sched.add(s)
    plan = sched.schedule(0.0)
    assert [(c.seq_id, c.num_tokens) for c in plan.chunks] == [(0, 6)]
    seqs = create_sequences(32, seed=3)
    outputs, _ = drive(create_scheduler("offline", num_blocks=20), seqs)
    assert outputs == reference_outputs(seqs)
