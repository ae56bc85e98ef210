"""Request-level modes (none, static, dynamic): batch start rules, slots, memory, outputs."""

from __future__ import annotations

import pytest
from runtime_factories import ToyRunner, create_scheduler, create_sequences, drive, reference_outputs

from servegate.runtime.scheduling import Sequence


def test_none_runs_one_request_at_a_time_to_the_end() -> None:
    seqs = create_sequences(5, seed=1)
    sched = create_scheduler("none", max_batch_size=8)  # mode none ignores the batch size
    outputs, plans = drive(sched, seqs)
    assert outputs == reference_outputs(seqs)
    assert all(len(p.chunks) == 1 for p in plans)
    order = [p.chunks[0].seq_id for p in plans]
    assert order == sorted(order)  # each request runs to its end before the next starts


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_a_batch_waits_for_max_wait_unless_it_is_full(mode: str) -> None:
    sched = create_scheduler(mode, max_batch_size=3, max_wait_s=0.5)
    sched.add(Sequence(0, [5, 6], 4, arrival_time=10.0))
    plan = sched.schedule(10.1)
    assert plan.is_empty and plan.wake_at == pytest.approx(10.5)
    sched.add(Sequence(1, [5, 7], 4, arrival_time=10.2))
    assert sched.schedule(10.3).is_empty
    plan = sched.schedule(10.5)  # the oldest has waited 0.5 s: start with what is there
    assert plan.admitted == (0, 1)

    full = create_scheduler(mode, max_batch_size=3, max_wait_s=5.0)
    for i in range(4):
        full.add(Sequence(i, [5, 6 + i], 4, arrival_time=0.0))
    plan = full.schedule(0.0)  # a full batch starts at once; the fourth waits for the next batch
    assert plan.admitted == (0, 1, 2)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_nobody_joins_a_batch_in_flight(mode: str) -> None:
    sched = create_scheduler(mode, max_batch_size=4)
    runner = ToyRunner(64, 4)
    sched.add(Sequence(0, [5, 6, 7], 3))
    plan = sched.schedule(0.0)
    sched.add(Sequence(1, [8, 9], 3))
    for step in range(3):
        runner.execute(plan.model_inputs)
        for seq in sched.update(plan, {c.seq_id: 10 for c in plan.chunks if c.samples}):
            if len(seq.output_token_ids) == seq.max_tokens:
                sched.finish(seq)
        plan = sched.schedule(1.0 + step)
        assert [c.seq_id for c in plan.chunks] == ([0] if step < 2 else [1])


def test_static_holds_finished_slots_and_memory_until_the_batch_ends() -> None:
    sched = create_scheduler("static", max_batch_size=4, num_blocks=32, block_size=4)
    short, long_ = Sequence(0, [5] * 4, 1), Sequence(1, [6] * 4, 5)
    sched.add(short)
    sched.add(long_)
    plan = sched.schedule(0.0)
    assert plan.padded_slots == 2  # a batch of 4 slots with 2 members
    reserved = sched.block_manager.num_used_blocks
    assert reserved == 2 + 3  # prompt + max_tokens reserved up front (4+1 -> 2 blocks, 4+5 -> 3 blocks)
    sched.update(plan, {0: 9, 1: 9})
    sched.finish(short)
    plan = sched.schedule(1.0)
    assert [c.seq_id for c in plan.chunks] == [1] and plan.padded_slots == 3
    assert sched.block_manager.num_used_blocks == reserved  # the finished member's memory stays
    for step in range(4):
        sched.update(plan, {1: 9})
        plan = sched.schedule(2.0 + step)
    sched.finish(long_)
    sched.schedule(9.0)
    assert sched.block_manager.num_used_blocks == 0


def test_dynamic_returns_a_finished_members_memory_at_once() -> None:
    sched = create_scheduler("dynamic", max_batch_size=4, num_blocks=32, block_size=4)
    short, long_ = Sequence(0, [5] * 4, 1), Sequence(1, [6] * 4, 5)
    sched.add(short)
    sched.add(long_)
    plan = sched.schedule(0.0)
    sched.update(plan, {0: 9, 1: 9})
    sched.finish(short)
    assert sched.block_manager.num_used_blocks == 3
    assert sched.schedule(1.0).padded_slots == 0


def test_a_batch_admits_only_what_memory_holds_and_never_preempts() -> None:
    sched = create_scheduler("dynamic", max_batch_size=8, num_blocks=6, block_size=4)
    seqs = [Sequence(i, [5 + i] * 6, 6) for i in range(4)]  # 12 tokens -> 3 blocks each
    outputs, plans = drive(sched, seqs)
    assert plans[0].admitted == (0, 1)
    assert sched.num_preemptions == 0
    assert outputs == reference_outputs(seqs)


def test_a_request_larger_than_the_whole_pool_is_rejected_not_stuck() -> None:
    sched = create_scheduler("static", max_batch_size=2, num_blocks=2, block_size=4)
    sched.add(Sequence(0, [5] * 6, 6))
    sched.add(Sequence(1, [6] * 2, 2))
    plan = sched.schedule(0.0)
    assert plan.rejected == (0,) and plan.admitted == (1,)


@pytest.mark.parametrize("mode", ["none", "static", "dynamic"])
def test_outputs_equal_the_unbatched_reference(mode: str) -> None:
    seqs = create_sequences(36, prompt_lens=(1, 30), max_tokens=(1, 20), seed=7)
    sched = create_scheduler(mode, max_batch_size=5, num_blocks=60, block_size=4)
    outputs, plans = drive(sched, seqs)
    assert outputs == reference_outputs(seqs)
    assert max(len(p.chunks) for p in plans) == (1 if mode == "none" else 5)
    assert sched.block_manager.num_used_blocks == 0
