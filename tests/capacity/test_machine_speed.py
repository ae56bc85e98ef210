"""The machine-speed monitor: a fixed loop timed on every CPU, summarized so a moving machine is named."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servegate.capacity.bench.machine_speed import (
    STEADY_SPREAD,
    MachineSpeed,
    MachineSpeedMonitor,
    Sample,
    sampled_cpus,
    summarize_samples,
)


def series(start: float, seconds: float, probe_us: float, cpus: tuple[int, ...] = (0, 1)) -> list[Sample]:
    """Samples every 50 ms on each CPU, all taking `probe_us`."""
    n = int(seconds / 0.05)
    return [Sample(start + 0.05 * i, cpu, probe_us) for i in range(n) for cpu in cpus]


def test_a_machine_that_halves_its_speed_midway_is_not_steady() -> None:
    # what the 2-core VM did: ~200 us a loop when the cores beside ours were idle, ~330 us when they were not
    samples = series(100.0, 2.0, 200.0) + series(102.0, 2.0, 330.0)
    speed = summarize_samples(samples)
    assert speed is not None
    assert speed.window_p10_us == pytest.approx(200.0) and speed.window_p90_us == pytest.approx(330.0)
    assert speed.spread == pytest.approx(1.65) and not speed.steady
    assert speed.samples == len(samples) and speed.per_cpu_us == {0: 265.0, 1: 265.0}
    assert speed.seconds == pytest.approx(3.95)
    assert "NOT steady" in speed.describe() and "spread 1.65x" in speed.describe()
    # each half alone held still, and the second ran 1.65x as long as the first
    first, second = summarize_samples(samples, ended=101.99), summarize_samples(samples, began=102.0)
    assert first is not None and second is not None
    assert first.steady and second.steady and first.probe_us == 200.0
    assert second.relative_to(first) == pytest.approx(1.65)
    assert second.relative_to(first.as_dict()) == pytest.approx(1.65)


def test_small_jitter_is_steady_and_the_summary_round_trips_through_json() -> None:
    samples = [Sample(10.0 + 0.05 * i, i % 2, 300.0 + (i % 7) * 5) for i in range(120)]
    speed = summarize_samples(samples)
    assert speed is not None and speed.steady and speed.spread < STEADY_SPREAD
    data = json.loads(json.dumps(speed.as_dict()))
    assert data["steady"] is True and "Python loop" in data["probe"]
    again = MachineSpeed.from_dict(data)
    assert again == speed
    assert summarize_samples(samples, began=1000.0) is None  # nothing sampled then


def test_the_monitor_samples_every_cpu_and_leaves_nothing_behind() -> None:
    monitor = MachineSpeedMonitor()
    with monitor:
        time.sleep(0.6)
        live = monitor.summary()  # readable while it runs
        procs = [proc for _, proc, _ in monitor._procs]
        folder = monitor._dir
    assert live is not None and live.samples >= 1
    assert all(proc.returncode is not None for proc in procs)
    assert folder is not None and not folder.exists()
    speed = monitor.summary()
    assert speed is not None and speed.probe_us > 0
    assert set(speed.per_cpu_us) == set(sampled_cpus())
    assert speed.samples >= len(speed.per_cpu_us) * 3  # ~12 loops per CPU in 0.6 s
    began = monitor.samples[len(monitor.samples) // 2].at
    part = monitor.summary(began=began)
    assert part is not None and part.samples < speed.samples


def test_samplers_exit_when_the_process_that_started_them_dies(tmp_path: Path) -> None:
    # a crash of gate profile or gate bench must not leave samplers spinning on every core
    script = (
        "import os, time\n"
        "from servegate.capacity.bench.machine_speed import MachineSpeedMonitor\n"
        "m = MachineSpeedMonitor(); m.start(); time.sleep(0.3)\n"
        "print(' '.join(str(p.pid) for _, p, _ in m._procs), flush=True)\n"
        "os._exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert pids

    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        return "State:\tZ" not in state  # a zombie has exited; only its parent's reaping is left

    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)


def test_cpus_to_sample_are_those_this_process_may_use() -> None:
    cpus = sampled_cpus()
    assert cpus and len(cpus) <= 8
    assert sampled_cpus(limit=1) == cpus[:1]


def test_gate_profile_warns_when_the_machine_moved_while_it_was_profiled() -> None:
    from servegate.cli.profile import machine_speed_lines

    shaky = summarize_samples(series(0.0, 2.0, 200.0) + series(2.0, 2.0, 330.0))
    calm = summarize_samples(series(0.0, 4.0, 200.0))
    assert shaky is not None and calm is not None
    warned = machine_speed_lines(shaky)
    assert warned[0].startswith("this machine while serving the traced runs: a 5,000-step Python loop took")
    assert "warning: its speed moved while it was profiled" in warned[1] and "profile again" in warned[1]
    assert len(machine_speed_lines(calm)) == 1
    assert machine_speed_lines(None) == []  # a profile from before the machine was sampled
