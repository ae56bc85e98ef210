"""Where a check's time went (servegate.gates.time_split): phases nest exclusively, a gate's time outside its
phases is its "other", the time outside every gate is "setup", and the rows add up to the check's wall time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from servegate.contracts.manifest import ServedModel
from servegate.gates.result import GateReport
from servegate.gates.time_split import KINDS, SETUP, TimeSplit


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_phase_inside_another_pauses_the_outer_ones_clock(clock: Clock) -> None:
    split = TimeSplit(clock)
    with split.gate("quality"):
        with split.phase("reference outputs"):
            clock.tick(1.0)
            with split.phase("model loads"):  # an engine loaded lazily while the suite runs
                clock.tick(2.0)
            clock.tick(0.5)
    assert split.seconds()["quality"] == {"model loads": 2.0, "reference outputs": 1.5}


def test_gate_time_outside_phases_is_other_and_time_outside_gates_is_setup(clock: Clock) -> None:
    split = TimeSplit(clock)
    clock.tick(0.25)  # loading the suites
    with split.gate("contract"):
        clock.tick(1.0)  # probes
        with split.phase("model loads"):
            clock.tick(3.0)
        clock.tick(0.5)  # scoring
    clock.tick(0.125)  # closing the engines
    assert split.seconds() == {SETUP: {"other": 0.375}, "contract": {"model loads": 3.0, "other": 1.5}}


def test_the_rows_add_up_to_the_checks_wall_time(clock: Clock) -> None:
    split = TimeSplit(clock)
    clock.tick(0.3)
    for name, kind in (("quantization", "candidate outputs"), ("caching", "timing audits"), ("capacity", "bench")):
        with split.gate(name):
            clock.tick(0.2)
            with split.phase(kind):  # type: ignore[arg-type]
                clock.tick(1.7)
                with split.phase("model loads"):
                    clock.tick(0.9)
    clock.tick(0.1)
    rows = split.seconds()
    assert sum(s for kinds in rows.values() for s in kinds.values()) == pytest.approx(split.total())
    assert rows["capacity"] == pytest.approx({"model loads": 0.9, "bench": 1.7, "other": 0.2})


def test_phases_that_end_out_of_order_do_not_corrupt_the_stack(clock: Clock) -> None:
    """A start-up task's phase opened inside the waiting coroutine's and closed after it: each removes its own."""
    split = TimeSplit(clock)
    outer, inner = split.phase("reference outputs"), split.phase("model loads")
    outer.__enter__()
    clock.tick(1.0)
    inner.__enter__()
    clock.tick(2.0)
    outer.__exit__(None, None, None)
    clock.tick(4.0)  # the model still loads
    inner.__exit__(None, None, None)
    clock.tick(8.0)
    assert split.seconds()[SETUP] == {"model loads": 6.0, "reference outputs": 1.0, "other": 8.0}


def test_an_awaited_start_in_another_task_is_charged_once(clock: Clock) -> None:
    split = TimeSplit(clock)

    async def start() -> None:
        with split.phase("model loads"):
            await asyncio.sleep(0)
            clock.tick(2.0)

    async def check() -> None:
        task = asyncio.create_task(start())
        clock.tick(0.5)
        await task
        clock.tick(0.25)

    with split.gate("contract"):
        asyncio.run(check())
    assert split.seconds()["contract"] == {"model loads": 2.0, "other": 0.75}


def test_a_phase_from_another_thread_is_charged_once_and_cannot_move_the_gate(clock: Clock) -> None:
    split = TimeSplit(clock)

    def worker() -> None:
        with split.gate("elsewhere"), split.phase("model loads"):
            clock.tick(3.0)

    with split.gate("load"):
        clock.tick(1.0)
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert split.seconds() == {"load": {"model loads": 3.0, "other": 1.0}}
    assert sum(split.seconds()["load"].values()) == pytest.approx(split.total())


def test_an_unknown_kind_is_refused_naming_the_kinds() -> None:
    with pytest.raises(ValueError, match="model loads"):
        with TimeSplit().phase("loading"):  # type: ignore[arg-type]
            pass


def test_as_dict_rounds_to_hundredths(clock: Clock) -> None:
    split = TimeSplit(clock)
    with split.gate("g"), split.phase("bench"):
        clock.tick(1.23456)
    assert split.as_dict()["g"] == {"bench": 1.23}


def test_a_check_reports_its_split_and_each_gates_kinds_add_up_to_its_time(
    check: Callable[..., GateReport], load: Callable[..., ServedModel]
) -> None:
    report = check(load("base.yaml", *[f"quality.suites.{i}.limit=20" for i in range(3)]), gates=("quantization",))
    split = report.time_split
    assert split is not None and set(split) == {SETUP, "quantization"}
    row = split["quantization"]
    assert row["model loads"] > 0 and row["divergence probe"] > 0  # fake engines: their outputs take no time
    assert set(row) <= set(KINDS)
    (gate,) = [g for g in report.gates if g.name == "quantization"]
    # the gate's time was taken apart from the split (timed()): only rounding separates them
    assert sum(row.values()) == pytest.approx(gate.duration_s, abs=0.005 * len(row) + 0.01)
    total = sum(s for kinds in split.values() for s in kinds.values())
    assert total == pytest.approx(report.duration_s, abs=0.005 * sum(map(len, split.values())) + 0.01)
    assert "time_split" not in report.to_dict()  # console only: the report's schema is unchanged
