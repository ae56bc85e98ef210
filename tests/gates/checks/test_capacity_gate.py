"""The capacity gate against an endpoint with known delays: it passes targets that hold, fails missed ones."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from support.synthetic_server import Delays, SyntheticServer

from servegate.contracts.manifest import ServedModel
from servegate.gates.base import GateContext
from servegate.gates.checks.capacity import CapacityPreparation
from servegate.gates.registry import GATES


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A load average of 0: the verdicts below must not depend on what else runs on the test machine."""
    import servegate.capacity.bench.load_generator as bench_module

    monkeypatch.setattr(bench_module.os, "getloadavg", lambda: (0.0, 0.0, 0.0))


@pytest.fixture
def gate_class() -> Iterator[type]:
    """The capacity gate as registered by `gate check` (imported through the check orchestration)."""
    importlib.import_module("servegate.gates.check")
    entry = GATES.entry("capacity")
    assert entry.obj.__module__ == "servegate.gates.checks.capacity"
    assert "capacity" in entry.metadata["watches"] and entry.metadata["purpose"]
    yield entry.obj


def served(url: str, targets: dict[str, Any] | None, **load: Any) -> ServedModel:
    capacity: dict[str, Any] = {
        "workload": {
            "input_tokens": {"mean": 8, "max": 8},
            "output_tokens": {"mean": 4, "max": 4},
            "rate_rps": 20,
            "num_requests": 12,
            **load,
        }
    }
    if targets is not None:
        capacity["targets"] = targets
    return ServedModel.model_validate(
        {
            "name": "remote",
            "weights": {"source": "zoo:tiny-primary"},
            "runtime": {"backend": "endpoint", "endpoint_url": url},
            "capacity": capacity,
        }
    )


def run(gate_class: type, url: str, targets: dict[str, Any] | None, **load: Any):  # noqa: ANN201
    manifest = served(url, targets, **load)
    return gate_class().run(GateContext(manifest, manifest))


def test_targets_that_hold_pass(gate_class: type) -> None:
    """A p99 within its budget passes once the sample can show it: 459 requests with none over (LoadGen's floor)."""
    targets = {"e2e_ms": {"p50": 500, "p99": 1000}, "ttft_ms": {"p99": 500}}
    with SyntheticServer(Delays(ttft_ms=20, itl_ms=5)) as server:
        result = run(gate_class, server.url, targets, rate_rps=250, num_requests=460)
        few = run(gate_class, server.url, targets)
    assert result.verdict == "pass", result.reason
    assert "3 target(s) met at 250 requests/s" in result.reason
    assert few.verdict == "warn" and "e2e_ms.p99" in few.reason and "p50" not in few.reason
    assert "0 of 12 requests over" in few.reason and "447 more requests, all within it, would pass it" in few.reason
    assert result.measurements.e2el_ms["p50"] >= 35  # 20 ms + 3 x 5 ms, measured
    assert all(t["met"] for t in result.measurements.targets)


def test_a_missed_latency_target_and_throughput_floor_fail_with_the_numbers(gate_class: type) -> None:
    with SyntheticServer(Delays(ttft_ms=60, itl_ms=5)) as server:
        result = run(gate_class, server.url, {"e2e_ms": {"p99": 30}, "throughput": {"value": 1000}})
    assert result.verdict == "fail"
    assert "e2e_ms.p99 " in result.reason and "against 30 ms (12 of 12 requests over" in result.reason
    assert "throughput.requests/s" in result.reason
    missed = {t["name"]: t for t in result.measurements.targets if not t["met"]}
    assert missed["e2e_ms.p99"]["missed_by"] > 40


def test_no_targets_is_skipped(gate_class: type) -> None:
    result = run(gate_class, "http://127.0.0.1:9/v1", None)
    assert result.verdict == "skipped" and "no capacity.targets" in result.reason


def test_a_prepared_server_is_the_one_benched(gate_class: type) -> None:
    """run_check calls prepare() on every gate first; the capacity gate then benches what was started for it."""

    class Started:
        def __init__(self, server: SyntheticServer) -> None:
            self.server, self.entered, self.stopped = server, False, False

        def __enter__(self) -> Any:
            self.entered = True
            return self.server

        def __exit__(self, *exc: object) -> None:
            self.stopped = True

    with SyntheticServer(Delays(ttft_ms=20, itl_ms=5)) as server:
        manifest = served(server.url, {"e2e_ms": {"p50": 1000}})
        ctx = GateContext(manifest, manifest)
        gate = gate_class()
        gate.prepare(ctx)
        assert gate.prepared == CapacityPreparation()  # an endpoint needs no server started
        gate.prepared.server = started = Started(server)
        result = gate.run(ctx)
    assert result.verdict == "pass", result.reason
    assert started.entered and started.stopped and gate.prepared.server is None


def test_what_a_gate_prepared_and_never_used_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    from servegate.gates import check

    stopped: list[str] = []

    class Left:
        def stop(self) -> None:
            stopped.append("left")

    def prepare(self: Any, ctx: GateContext) -> None:
        self.prepared.baseline = Left()

    def fail(self: Any, ctx: GateContext) -> Any:
        raise RuntimeError("the gate broke before using what it prepared")

    gate = GATES.get("capacity")
    monkeypatch.setattr(gate, "prepare", prepare)
    monkeypatch.setattr(gate, "run", fail)
    monkeypatch.setattr(check, "_probe_remote", lambda ctx, planned: None)  # no remote here: only prepare matters
    manifest = served("http://127.0.0.1:9/v1", {"e2e_ms": {"p99": 1000}})
    report = check.run_check(manifest, manifest, forced=("capacity",))
    (result,) = [g for g in report.gates if g.name == "capacity"]
    assert result.verdict == "fail" and "broke" in result.reason
    assert stopped == ["left"]


class Measured:
    """A server that reports its peak resident memory, as LocalServer does for the manifest's own server."""

    def __init__(self, server: SyntheticServer, peak: int) -> None:
        self.server, self.peak = server, peak
        self.url = server.url

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def peak_rss_bytes(self) -> int:
        return self.peak


@pytest.mark.parametrize(("peak_mib", "verdict"), [(300, "pass"), (600, "fail")])
def test_memory_is_the_peak_of_the_server_process_it_ran(gate_class: type, peak_mib: int, verdict: str) -> None:
    with SyntheticServer(Delays(ttft_ms=5, itl_ms=2)) as server:
        manifest = served(server.url, {"e2e_ms": {"p50": 1000}, "memory": "512MiB"})
        ctx = GateContext(manifest, manifest)
        gate = gate_class()
        gate.prepared.server = Measured(server, peak_mib * 2**20)
        result = gate.run(ctx)
    assert result.verdict == verdict, result.reason
    assert result.measurements.peak_memory_bytes == peak_mib * 2**20
    memory = next(t for t in result.measurements.targets if t["name"] == "memory")
    assert memory["predicted"] == peak_mib * 2**20 and memory["met"] == (verdict == "pass")
    if verdict == "pass":
        assert "peak resident memory of the server process" in result.reason
    else:
        assert "memory measured 600.00 MiB against 512.00 MiB (missed by 88.00 MiB, 17.2%)" in result.reason


def test_an_endpoints_memory_is_never_the_manifests_plan(gate_class: type) -> None:
    with SyntheticServer(Delays(ttft_ms=5, itl_ms=2)) as server:  # a remote whose memory nothing reports
        result = run(gate_class, server.url, {"e2e_ms": {"p50": 1000}, "memory": "512MiB"})
    assert result.verdict == "warn", result.reason
    assert result.measurements.peak_memory_bytes is None
    assert "memory target not checked" in result.reason and "planned" not in result.reason
    assert all(t["name"] != "memory" for t in result.measurements.targets)


class ShakyMachine:
    """A machine-speed monitor that saw the machine slow down 1.65x during the bench."""

    def __enter__(self) -> ShakyMachine:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def summary(self, began: float | None = None, ended: float | None = None) -> Any:
        from servegate.capacity.bench.machine_speed import MachineSpeed

        return MachineSpeed(265.0, {0: 265.0}, 200.0, 330.0, samples=80, seconds=4.0)


def test_a_miss_measured_while_the_machine_moved_says_so(gate_class: type, monkeypatch: pytest.MonkeyPatch) -> None:
    import servegate.capacity.bench.load_generator as bench_module

    with SyntheticServer(Delays(ttft_ms=60, itl_ms=5)) as server:
        steady = run(gate_class, server.url, {"e2e_ms": {"p99": 30}})
        monkeypatch.setattr(bench_module, "MachineSpeedMonitor", ShakyMachine)
        shaky = run(gate_class, server.url, {"e2e_ms": {"p99": 30}})
    assert steady.verdict == "fail" and shaky.verdict == "fail"
    assert shaky.measurements.machine_speed["spread"] == pytest.approx(1.65)
    assert "machine's speed moved by 1.65x during the bench" in shaky.reason and "steady machine" in shaky.reason
    assert steady.measurements.machine_speed["probe_us"] > 0
    assert ("speed moved" in steady.reason) == (not steady.measurements.machine_speed["steady"])


def test_a_miss_on_an_oversubscribed_machine_is_a_warning_that_says_so(
    gate_class: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Load average 9 on 2 CPUs: other work shared the cores, so a single manifest's miss is inconclusive."""
    import servegate.capacity.bench.load_generator as bench_module

    monkeypatch.setattr(bench_module.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(bench_module.os, "sched_getaffinity", lambda pid: {0, 1})
    with SyntheticServer(Delays(ttft_ms=60, itl_ms=5)) as server:
        result = run(gate_class, server.url, {"e2e_ms": {"p50": 30}})
    assert result.verdict == "warn", result.reason
    assert "oversubscribed during the bench (load average 9.0 on 2 CPUs)" in result.reason
    assert result.measurements.targets[0]["machine_oversubscribed"] is True
