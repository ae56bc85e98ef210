"""A single manifest's capacity gate beside competing processes: contention is detected and reported, and a miss
on a machine that moved is inconclusive, never a failure (issue 33, defect 5)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.synthetic_server import Delays, SyntheticServer

from servegate.capacity.bench.contention import (
    TEAM_STALL,
    ContentionProbe,
    judge_contention,
    run_queue_times,
    wait_share_between,
)
from servegate.capacity.bench.machine_speed import MachineSpeed
from servegate.contracts.manifest import ServedModel
from servegate.gates.base import GateContext
from servegate.gates.registry import GATES

CPUS = len(os.sched_getaffinity(0))
SPIN = "while True: pass"


@contextmanager
def spinning(count: int, nice: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` processes spinning a core each at `nice` (0: normal priority), killed at the end."""
    prefix = ["nice", "-n", str(nice)] if nice else []
    hogs = [subprocess.Popen([*prefix, sys.executable, "-c", SPIN]) for _ in range(count)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(10)


class SteadyMachine:
    """A machine-speed monitor that always reports a steady machine (the load of the test machine aside)."""

    def __enter__(self) -> SteadyMachine:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def summary(self, began: float | None = None, ended: float | None = None) -> MachineSpeed:
        return MachineSpeed(200.0, {0: 200.0}, 199.0, 201.0, 40, 2.0)


@pytest.fixture
def held_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A load average of 0 and a steady Python loop: what the gate knew before it probed for contention, so only
    the probe (or the control) can tell it that the machine moved."""
    import servegate.capacity.bench.load_generator as bench_module

    monkeypatch.setattr(bench_module.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(bench_module, "MachineSpeedMonitor", SteadyMachine)


def local(threads: int, requests: int = 40) -> ServedModel:
    """A manifest served here (the reference runtime), with a short open-loop workload and a 30 ms E2E target."""
    load = {"input_tokens": {"mean": 8, "max": 8}, "output_tokens": {"mean": 4, "max": 4}, "rate_rps": 20,
            "num_requests": requests}  # fmt: skip
    return ServedModel.model_validate(
        {
            "name": "local",
            "weights": {"source": "zoo:tiny-primary"},
            "runtime": {"threads": threads},
            "batching": {"mode": "dynamic", "max_batch_size": 8},
            "capacity": {"workload": load, "targets": {"e2e_ms": {"p50": 30}}},
        }
    )


def steady() -> SyntheticServer:
    """A reference form whose rounds hold still."""
    return SyntheticServer(Delays(ttft_ms=5, itl_ms=10))


def gate_with(candidate: Any, reference: Any = steady) -> Any:
    """The capacity gate with the candidate's and the reference form's servers substituted (the reference form
    is the one with batching `none`); each factory is a callable returning a fresh context manager."""
    importlib.import_module("servegate.gates.check")
    base = GATES.entry("capacity").obj

    class Substituted(base):  # type: ignore[misc, valid-type]
        server_factory = staticmethod(
            lambda served: (reference if served.batching.mode == "none" else candidate)()  # type: ignore[misc]
        )

    return Substituted()


def check(served: ServedModel, gate: Any) -> Any:
    """`gate check M`: the manifest against its reference form."""
    return gate.run(GateContext(served.reference_form(), served, mode="reference"))


# slow-only: it asserts a physical stall, which a shared VM's scheduler does not always give (it flaked once in a
# fresh-clone CI run on 2026-12-02 and passed 3 of 3 straight after); the gate-level tests below fake the machine
@pytest.mark.slow
@pytest.mark.parametrize("nice", [0, 19])
def test_the_probe_sees_a_thread_team_stall_beside_spinning_processes(nice: int) -> None:
    """A team as large as the machine with a process spinning on each of its cores: each parallel op waits."""
    threads = max(2, CPUS)
    with ContentionProbe(threads) as probe, spinning(threads, nice):
        probe.begin()  # the `with` began it; again is harmless and waits for nothing
        began = time.time()
        time.sleep(2.5)
        seen = judge_contention(probe.samples_between(began, time.time()), threads)
    assert seen.samples >= 3, seen
    assert seen.team_over_single is not None and seen.team_over_single > TEAM_STALL, seen.describe()
    assert seen.contended and "slower than one thread" in seen.describe()


def test_a_process_beside_spinning_processes_waits_for_a_core() -> None:
    """Linux's run-queue wait of a busy process rises over the gate's limit with two spinners per core beside it."""
    with spinning(1, 0) as (busy,), spinning(2 * CPUS, 0):
        time.sleep(0.3)
        before = run_queue_times(busy.pid)
        time.sleep(1.5)
        share = wait_share_between(before, run_queue_times(busy.pid))
    assert share is not None and share > 0.25, share
    assert judge_contention([], 1, share).contended


@pytest.mark.parametrize("nice", [0, pytest.param(19, marks=pytest.mark.slow)])
def test_a_miss_beside_competing_processes_is_inconclusive_and_says_why(held_machine: None, nice: int) -> None:
    """The server misses its target (a slow synthetic server standing in for the stalled one) while processes spin
    on every core: the probe of the manifest's thread team sees it, and the gate warns, naming the contention.
    Before the probe, with the load average and the Python loop quiet, this failed."""
    threads = max(2, CPUS)
    gate = gate_with(lambda: SyntheticServer(Delays(ttft_ms=60, itl_ms=5)))
    served = local(threads, requests=60)  # 3 s of arrivals: a stalled probe still takes a few samples
    probe = ContentionProbe(threads)  # launched early, as `gate check` does in the gate's prepare()
    assert probe.wait_ready()
    with spinning(threads, nice):
        ctx = GateContext(served.reference_form(), served, mode="reference")
        gate.prepared.probe = probe
        result = gate.run(ctx)
    assert result.verdict == "warn", result.reason
    assert "the machine moved during the bench" in result.reason and "inconclusive" in result.reason
    assert f"its {threads}-thread team ran the probe" in result.reason
    contention = result.measurements.contention
    # the reason above names the stall; the whole bench's own mean ratio was once seen at or under the limit
    # while it did (a fresh-clone CI run, 2026-12-03), so only its presence is asserted here
    assert contention["samples"] > 0 and contention["team_over_single"] is not None
    assert result.measurements.targets[0]["machine_moved"] is True
    control = result.measurements.control
    # a second bench runs only when the first did not show the stall: a shared VM's scheduler does not always stall
    # the team during the first bench (a fresh-clone CI run, 2026-12-05: the control's probe saw 11.1x instead)
    if contention["contended"]:
        assert control is None  # the bench already showed the machine moved: no second bench
    else:
        assert control is not None and control["machine_moved"] is True, control
        assert control["contention"]["contended"], control


def test_a_miss_that_repeats_beside_a_steady_reference_form_fails(held_machine: None) -> None:
    """A quiet machine (one thread: no team to probe) and a miss that holds in the control bench: a failure."""
    gate = gate_with(lambda: SyntheticServer(Delays(ttft_ms=60, itl_ms=5)))
    result = check(local(1), gate)
    assert result.verdict == "fail", result.reason
    assert "held in a second bench interleaved with the reference form" in result.reason
    control = result.measurements.control
    assert control["machine_moved"] is False and control["candidate_verdict"] == "fail"
    assert control["reference_form_metric"] == "tpot_ms" and control["reference_form_spread"] < 1.5


class SlowAtFirst(SyntheticServer):
    """A synthetic server slow for its first `slow` requests, then fast: a machine that calmed down."""

    def __init__(self, slow: int) -> None:
        super().__init__(Delays(ttft_ms=60, itl_ms=5))
        self.slow = slow

    async def _respond(self, request: dict, received: float, writer: Any) -> None:
        if self.requests_seen > self.slow:
            self.delays = Delays(ttft_ms=5, itl_ms=2)
        await super()._respond(request, received, writer)


def test_a_miss_that_does_not_repeat_in_the_control_is_inconclusive(held_machine: None) -> None:
    """The first bench misses (its probe and 40 requests), the second, interleaved with the reference form, does
    not: the machine moved."""
    gate = gate_with(lambda: SlowAtFirst(slow=41))
    result = check(local(1), gate)
    assert result.verdict == "warn", result.reason
    assert "the miss did not repeat in a second bench interleaved with the reference form (pass)" in result.reason
    assert result.measurements.control["machine_moved"] is True


def test_an_endpoint_is_judged_as_before_without_probe_or_control(held_machine: None) -> None:
    """A remote's cores are not this machine's: no probe, no control, the miss fails as it did."""
    with SyntheticServer(Delays(ttft_ms=60, itl_ms=5)) as server:
        remote = local(2).model_copy(
            update={"runtime": local(2).runtime.model_copy(update={"backend": "endpoint", "endpoint_url": server.url})}
        )
        importlib.import_module("servegate.gates.check")
        result = GATES.entry("capacity").obj().run(GateContext(remote, remote))
    assert result.verdict == "fail" and result.measurements.contention is None and result.measurements.control is None


QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart"


@pytest.mark.slow
@pytest.mark.parametrize(("threads", "nice"), [(2, 19), (2, 0), (1, 19)])
def test_the_issue_case_beside_two_spinning_processes_does_not_fail(threads: int, nice: int) -> None:
    """`gate check unsafe-truncation.yaml` (a change that only shortens prompts) with two processes spinning beside
    it: on two threads the steps collapse and the gate says why (inconclusive); on one thread it passes."""
    from servegate.cli.common import load

    served = load(QUICKSTART / "unsafe-truncation.yaml", [f"runtime.threads={threads}"])
    importlib.import_module("servegate.gates.check")
    with spinning(2, nice):
        result = GATES.entry("capacity").obj().run(GateContext(served.reference_form(), served, mode="reference"))
    assert result.verdict in ("pass", "warn"), result.reason
    contention = result.measurements.contention
    assert contention is not None and contention["wait_share"] is not None
    if threads == 2:
        assert contention["team_over_single"] > TEAM_STALL and contention["contended"], contention
