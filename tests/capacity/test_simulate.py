"""The discrete-event simulation on timelines computed by hand (the runtime's own schedulers decide)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servegate.capacity.bench.workload import RequestSpec
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.simulate import SimSetup, simulate
from servegate.capacity.latency.terms import ServingOverheads, StepCost, StepJitter

# a step costs 10 ms + 1 ms per prefill token + 2 ms per decoding sequence; 5 ms before a request
# reaches the scheduler, 1 ms from its last token to the end of its response
MODEL = LatencyModel(
    StepCost(c_step=0.010, c_prefill_token=0.001, c_decode_seq=0.002),
    ServingOverheads(request_s=0.005, finish_s=0.001),
)


def with_overheads(**terms: float) -> LatencyModel:
    """MODEL with the given serving overheads changed."""
    return replace(MODEL, overheads=replace(MODEL.overheads, **terms))


def setup(mode: str, batch: int = 8, **kw: object) -> SimSetup:
    return SimSetup(mode, 1 if mode == "none" else batch, 0.0, 2048, False, num_blocks=64, block_size=16, **kw)


def test_one_request_alone() -> None:
    [r] = simulate(setup("none"), MODEL, [RequestSpec(10, 4, 0.0)], jitter=False).records
    # reaches the scheduler at 5 ms; prefill 10 + 10 = 20 ms -> first token at 25 ms;
    # three decode steps of 12 ms -> last token at 61 ms; response ends 1 ms later
    assert r.ttft == pytest.approx(0.025)
    assert r.token_times == pytest.approx([0.025, 0.037, 0.049, 0.061])
    assert r.e2el == pytest.approx(0.062)
    assert r.tpot == pytest.approx(0.037 / 3)


def test_no_batching_queues_the_second_request_behind_the_first() -> None:
    a, b = simulate(setup("none"), MODEL, [RequestSpec(10, 4, 0.0), RequestSpec(10, 4, 0.0)], jitter=False).records
    assert a.ttft == pytest.approx(0.025)
    assert b.ttft == pytest.approx(0.061 + 0.020)  # starts when the first one's last step ends


def test_continuous_batching_prefills_both_in_one_step_and_decodes_together() -> None:
    result = simulate(setup("continuous"), MODEL, [RequestSpec(10, 4, 0.0), RequestSpec(10, 4, 0.0)], jitter=False)
    a, b = result.records
    # one step with 20 prompt tokens: 10 + 20 = 30 ms; decode steps of two sequences: 10 + 4 = 14 ms
    assert a.ttft == b.ttft == pytest.approx(0.035)
    assert a.e2el == pytest.approx(0.035 + 3 * 0.014 + 0.001)
    assert result.steps == 4
    assert max(n for _, n in result.running) == 2


def test_dynamic_batching_waits_for_the_window() -> None:
    windowed = SimSetup("dynamic", 8, 0.050, 2048, False, 64, 16)
    [r] = simulate(windowed, MODEL, [RequestSpec(10, 2, 0.0)], jitter=False).records
    assert r.ttft == pytest.approx(0.005 + 0.050 + 0.020)  # waits 50 ms for company that never comes


def test_full_queue_rejects_the_newest_request() -> None:
    specs = [RequestSpec(10, 4, 0.000), RequestSpec(10, 4, 0.001), RequestSpec(10, 4, 0.002)]
    records = simulate(setup("none", max_queue=1), MODEL, specs, jitter=False).records
    assert [r.error for r in records] == [None, None, "overloaded"]


def test_deadline_fails_requests_that_wait_too_long() -> None:
    specs = [RequestSpec(10, 4, 0.0)] * 3
    records = simulate(setup("none", timeout_s=0.05), MODEL, specs, jitter=False).records
    assert records[0].ok
    assert [r.error for r in records[1:]] == ["deadline_exceeded", "deadline_exceeded"]


def test_closed_loop_sends_the_next_request_when_one_returns() -> None:
    specs = [RequestSpec(10, 4, None)] * 3
    records = simulate(setup("none"), MODEL, specs, concurrency=1, jitter=False).records
    assert [r.scheduled for r in records] == pytest.approx([0.0, 0.062, 0.124])
    assert all(r.e2el == pytest.approx(0.062) for r in records)


def test_a_small_pool_preempts_and_still_finishes_everything() -> None:
    tight = SimSetup("continuous", 8, 0.0, 2048, False, num_blocks=4, block_size=4)
    result = simulate(tight, MODEL, [RequestSpec(6, 6, 0.0) for _ in range(3)], jitter=False)
    assert all(r.ok and r.output_tokens == 6 for r in result.records)
    assert result.preemptions > 0
    assert max(n for _, n in result.kv_blocks_used) <= 4


def test_jitter_keeps_the_mean_step_time() -> None:
    noisy = replace(MODEL, jitter=StepJitter(spread=0.3))
    specs = [RequestSpec(10, 50, None)]
    base = simulate(setup("none"), MODEL, specs, concurrency=1, jitter=False).records[0].e2el
    runs = [simulate(setup("none"), noisy, specs, concurrency=1, seed=s).records[0].e2el for s in range(30)]
    assert sum(runs) / len(runs) == pytest.approx(base, rel=0.05)
    assert max(runs) > min(runs)


def test_a_request_sent_during_a_step_lengthens_it_by_the_arrival_overhead() -> None:
    busy = with_overheads(arrival_s=0.005)
    a, _ = simulate(setup("none"), busy, [RequestSpec(10, 4, 0.0), RequestSpec(10, 4, 0.030)], jitter=False).records
    # the second request is sent at 30 ms, inside the first decode step [25, 37] ms, which ends 5 ms later
    assert a.token_times == pytest.approx([0.025, 0.042, 0.054, 0.066])


def test_the_step_after_an_answer_pays_for_sending_it_when_it_follows_at_once() -> None:
    answering = with_overheads(completion_s=0.004)
    specs = [RequestSpec(10, 2, 0.0), RequestSpec(10, 3, 0.0)]
    plain = simulate(setup("continuous"), MODEL, specs, jitter=False).records
    a, b = simulate(setup("continuous"), answering, specs, jitter=False).records
    # both prefilled in one step (5-35 ms), decoded together (35-49 ms), where the first is answered; the
    # second's last decode step starts at once and lasts 4 ms longer (49-65 ms instead of 49-61)
    assert a.end == pytest.approx(plain[0].end)
    assert b.token_times[:-1] == pytest.approx(plain[1].token_times[:-1])
    assert b.token_times[-1] == pytest.approx(plain[1].token_times[-1] + 0.004)
    # a request answered while nothing else runs costs no later step anything
    lone = simulate(setup("continuous"), answering, [RequestSpec(10, 3, 0.0), RequestSpec(10, 3, 1.0)], jitter=False)
    alone = simulate(setup("continuous"), MODEL, [RequestSpec(10, 3, 0.0), RequestSpec(10, 3, 1.0)], jitter=False)
    assert [r.end for r in lone.records] == pytest.approx([r.end for r in alone.records])


def test_steps_slow_down_with_the_requests_sent_just_before_them() -> None:
    loaded = with_overheads(load_slowdown_per_rps=0.001)
    burst = [RequestSpec(10, 2, 0.0) for _ in range(10)]
    plain = simulate(setup("continuous", batch=16), MODEL, burst, jitter=False).records[0]
    busy = simulate(setup("continuous", batch=16), loaded, burst, jitter=False).records[0]
    # 10 requests sent in the last 0.1 s are 100 requests/s: every step within 0.1 s of them is 10% longer
    # (prefill 5-115 ms becomes 5-126 ms; the decode step after it begins past the window and is not)
    assert plain.token_times == pytest.approx([0.115, 0.145])
    assert busy.token_times == pytest.approx([0.126, 0.156])
    # spread over 2 s, the same requests barely slow anything
    spread = [RequestSpec(10, 2, 0.2 * i) for i in range(10)]
    alone = simulate(setup("continuous"), MODEL, spread, jitter=False).records
    assert [r.e2el for r in simulate(setup("continuous"), loaded, spread, jitter=False).records] == pytest.approx(
        [r.e2el * 1.01 for r in alone], rel=0.005
    )


def test_serving_work_stretches_every_part_of_a_request_by_the_share_the_requests_served_hold() -> None:
    from servegate.capacity.latency.terms import SHARE_WINDOW_S

    shared = with_overheads(serving_work_s=0.025)
    # lone, each request takes 5 ms to the scheduler, a 20 ms prefill, 3 decodes of 12 ms and 1 ms after its last
    # token. Sent at 0, 0.1 and 0.2 s they never overlap; each part is stretched by the requests that ended in the
    # engine in the SHARE_WINDOW_S (0.3 s) before it starts: each one a share 0.025 s / SHARE_WINDOW_S
    one = 0.025 / SHARE_WINDOW_S
    specs = [RequestSpec(10, 4, 0.0), RequestSpec(10, 4, 0.1), RequestSpec(10, 4, 0.2)]
    a, b, c = simulate(setup("none"), shared, specs, jitter=False).records
    assert a.e2el == pytest.approx(0.061 + 0.001 / (1 - one))  # only its own end precedes its way out
    assert b.ttft == pytest.approx((0.005 + 0.020) / (1 - one))  # a's end, at 0.061 s
    assert b.e2el == pytest.approx(0.061 / (1 - one) + 0.001 / (1 - 2 * one))
    assert c.e2el == pytest.approx(0.061 / (1 - 2 * one) + 0.001 / (1 - 3 * one))  # a's, b's, then its own end
    plain = simulate(setup("none"), MODEL, specs, jitter=False).records
    assert [r.e2el for r in plain] == pytest.approx([0.062] * 3)
    # the served rate is read at most at the measured capacity: 6 requests/s here (not 2 / 0.3 s), a 15% share
    capped = with_overheads(serving_work_s=0.025, capacity_rps=6.0)
    c_capped = simulate(setup("none"), capped, specs, jitter=False).records[2]
    assert c_capped.ttft == pytest.approx((0.005 + 0.020) / 0.85)
    # a rate of 40 requests/s holds all but the cap (99%) of the machine: parts take 100x as long, not forever
    assert ServingOverheads(serving_work_s=0.025).stretch(40.0) == pytest.approx(100.0)
    assert ServingOverheads(serving_work_s=0.025, capacity_rps=30.0).stretch(40.0) == pytest.approx(4.0)
    assert ServingOverheads().stretch(40.0) == 1.0


def test_admission_waits_for_the_streaming_of_running_sequences() -> None:
    busy = with_overheads(admission_delay_per_running_s=0.004)
    alone = simulate(setup("continuous"), busy, [RequestSpec(10, 4, 0.0)], jitter=False).records[0]
    assert alone.ttft == pytest.approx(0.025)  # nobody running: no extra delay
    specs = [RequestSpec(10, 4, 0.0), RequestSpec(10, 4, 0.030)]
    # the first is prefilled 5-25 ms and decodes 25-37, 37-49; the second, sent at 30 ms, is read at the
    # 37 ms boundary. Without the delay it is there (30 + 5 ms) and joins the step 37-59 (10 + 10 + 2 ms):
    # TTFT 29 ms. With one sequence running it arrives at 30 + 5 + 4 = 39 ms, so it joins the step 49-71.
    plain = simulate(setup("continuous"), MODEL, specs, jitter=False).records
    a, b = simulate(setup("continuous"), busy, specs, jitter=False).records
    assert plain[1].ttft == pytest.approx(0.029)
    assert a.ttft == pytest.approx(0.025) and b.ttft == pytest.approx(0.041)
