"""How fast this machine's CPUs ran while something was measured: a fixed Python loop timed on every CPU.

A shared or virtual machine does not keep its speed. On the 2-core VM of benchmarks/README.md a pure
Python loop takes either ~0.20 or ~0.33 ms, switching within seconds as other tenants use the cores
beside ours, and the server's latency follows: the same 300 requests near the knee measured a p50 of 64
to 263 ms in back-to-back runs. No latency model fitted at one moment predicts another moment on such a
machine, so profiles and benches record the machine's speed beside their figures: a sampler process per
CPU (pinned to it where the OS allows) times the same small loop every `interval_s` and writes what it
took. Comparing the median with the profile's tells how much of a prediction's error is the machine, and
the spread of its half-second medians tells whether the machine held still at all.

The samplers cost about 0.5% of each CPU (a ~0.25 ms loop every 50 ms), need no third-party package, and
exit on their own when the process that started them dies.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROBE_STEPS = 5000
"""Additions in the timed loop (about 0.2-0.35 ms of one core of the VMs measured)."""
INTERVAL_S = 0.05
"""Seconds each sampler sleeps between loops."""
WINDOW_S = 0.5
"""Samples of all CPUs within this many seconds are pooled into one median (the speed at that moment)."""
STEADY_SPREAD = 1.25
"""A run whose 90th-percentile window took more than this many times its 10th-percentile one was not steady."""
MAX_SAMPLED_CPUS = 8
"""Most CPUs sampled (spread over the ones this process may use)."""

_SAMPLER = """
import os, sys, time
def probe(steps):
    began = time.perf_counter()
    total = 0
    for i in range(steps):
        total += i
    return time.perf_counter() - began
def main(cpu, interval, steps, parent, path):
    if cpu >= 0:
        try:
            os.sched_setaffinity(0, {cpu})
        except (AttributeError, OSError):
            pass
    with open(path, "w", buffering=1) as out:
        while os.getppid() == parent:
            took = probe(steps)
            out.write(f"{time.time():.4f} {took * 1e6:.2f}\\n")
            time.sleep(interval)
main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
"""
"""The sampler's program (stdlib only, run with -I so no site packages load): one timed loop per interval,
"wall-clock seconds, microseconds" per line, until its parent is gone."""


@dataclass(frozen=True)
class Sample:
    """One timed loop."""

    at: float
    """Wall-clock time it ended (time.time())."""
    cpu: int
    """The CPU its sampler was pinned to (-1: not pinned)."""
    probe_us: float
    """Microseconds the loop took."""


@dataclass(frozen=True)
class MachineSpeed:
    """The loop's timings over one stretch of time: its median and how much it moved."""

    probe_us: float
    """Median microseconds of the loop over all CPUs and samples (higher: a slower machine)."""
    per_cpu_us: dict[int, float]
    """Median per sampled CPU."""
    window_p10_us: float
    """10th percentile of the WINDOW_S medians (the machine at its fastest, bar outliers)."""
    window_p90_us: float
    """90th percentile of the WINDOW_S medians (at its slowest)."""
    samples: int
    seconds: float
    """From the first sample to the last."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MachineSpeed:
        """Inverse of as_dict."""
        return cls(
            probe_us=float(data["probe_us"]),
            per_cpu_us={int(cpu): float(us) for cpu, us in data.get("per_cpu_us", {}).items()},
            window_p10_us=float(data["window_p10_us"]),
            window_p90_us=float(data["window_p90_us"]),
            samples=int(data.get("samples", 0)),
            seconds=float(data.get("seconds", 0.0)),
        )

    @property
    def spread(self) -> float:
        """How much slower the machine ran at its slowest than at its fastest moments (p90 / p10 of windows)."""
        return self.window_p90_us / self.window_p10_us if self.window_p10_us > 0 else float("nan")

    @property
    def steady(self) -> bool:
        """Whether the machine held its speed (spread within STEADY_SPREAD)."""
        return self.spread <= STEADY_SPREAD

    def relative_to(self, reference: MachineSpeed | dict[str, Any]) -> float:
        """This stretch's median loop time over the reference's: above 1, the machine ran slower now."""
        then = reference.probe_us if isinstance(reference, MachineSpeed) else float(reference["probe_us"])
        return self.probe_us / then if then > 0 else float("nan")

    def describe(self) -> str:
        """One line: the median, the range of the windows and whether that was steady."""
        verdict = "steady" if self.steady else f"NOT steady (more than {STEADY_SPREAD:.2f}x)"
        return (
            f"a {PROBE_STEPS:,}-step Python loop took {self.probe_us:.0f} us (median over {self.samples} samples "
            f"on {len(self.per_cpu_us)} CPU(s); {WINDOW_S:g} s medians {self.window_p10_us:.0f}-"
            f"{self.window_p90_us:.0f} us, spread {self.spread:.2f}x: {verdict})"
        )

    def as_dict(self) -> dict[str, Any]:
        """The plain JSON form."""
        return {
            "probe_us": self.probe_us,
            "per_cpu_us": {str(cpu): us for cpu, us in self.per_cpu_us.items()},
            "window_p10_us": self.window_p10_us,
            "window_p90_us": self.window_p90_us,
            "spread": self.spread,
            "steady": self.steady,
            "samples": self.samples,
            "seconds": self.seconds,
            "probe": f"{PROBE_STEPS} additions in a Python loop, timed on each CPU every {INTERVAL_S:g} s",
        }


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize_samples(
    samples: Iterable[Sample], began: float | None = None, ended: float | None = None
) -> MachineSpeed | None:
    """The speed over the samples taken between `began` and `ended` (wall-clock seconds; open when None);
    None when there are none."""
    kept = [s for s in samples if (began is None or s.at >= began) and (ended is None or s.at <= ended)]
    if not kept:
        return None
    first = min(s.at for s in kept)
    windows: dict[int, list[float]] = {}
    by_cpu: dict[int, list[float]] = {}
    for s in kept:
        windows.setdefault(int((s.at - first) // WINDOW_S), []).append(s.probe_us)
        by_cpu.setdefault(s.cpu, []).append(s.probe_us)
    medians = [statistics.median(v) for v in windows.values()]
    return MachineSpeed(
        probe_us=statistics.median(s.probe_us for s in kept),
        per_cpu_us={cpu: statistics.median(v) for cpu, v in sorted(by_cpu.items())},
        window_p10_us=_percentile(medians, 0.1),
        window_p90_us=_percentile(medians, 0.9),
        samples=len(kept),
        seconds=max(s.at for s in kept) - first,
    )


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system has one, else every core)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def sampled_cpus(limit: int = MAX_SAMPLED_CPUS) -> list[int]:
    """The CPUs to pin samplers to: those this process may run on, at most `limit` spread evenly; [-1] (one
    unpinned sampler) where the OS does not say."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return [-1]
    if len(allowed) <= limit:
        return allowed
    step = len(allowed) / limit
    return [allowed[int(i * step)] for i in range(limit)]


class MachineSpeedMonitor:
    """Samplers timing the loop on each CPU while a `with` block runs; `summary()` says how fast it ran.

    Use `summary(began, ended)` for a part of the block (wall-clock seconds, e.g. one bench run).
    """

    def __init__(self, interval_s: float = INTERVAL_S, cpus: Sequence[int] | None = None) -> None:
        self.interval_s = interval_s
        self.cpus = list(cpus) if cpus is not None else sampled_cpus()
        self.samples: list[Sample] = []
        self._procs: list[tuple[int, subprocess.Popen[bytes], Path]] = []
        self._dir: Path | None = None

    def __enter__(self) -> MachineSpeedMonitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start one sampler per CPU."""
        self._dir = Path(tempfile.mkdtemp(prefix="servegate-speed-"))
        for cpu in self.cpus:
            path = self._dir / f"cpu{cpu}.txt"
            args = [str(cpu), str(self.interval_s), str(PROBE_STEPS), str(os.getpid()), str(path)]
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _SAMPLER, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self._procs.append((cpu, proc, path))

    def stop(self) -> list[Sample]:
        """Stop the samplers and collect what they timed (also kept in `samples`)."""
        for _, proc, _ in self._procs:
            proc.terminate()
        for cpu, proc, path in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self.samples += _read_samples(path, cpu)
        self._procs = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self.samples.sort(key=lambda s: s.at)
        return self.samples

    def summary(self, began: float | None = None, ended: float | None = None) -> MachineSpeed | None:
        """The speed over everything sampled so far, or between `began` and `ended` (wall-clock seconds)."""
        if self._procs:  # still sampling: what the samplers have written until now
            so_far = (s for cpu, _, path in self._procs for s in _read_samples(path, cpu))
            return summarize_samples(so_far, began, ended)
        return summarize_samples(self.samples, began, ended)


def _read_samples(path: Path, cpu: int) -> list[Sample]:
    """A sampler's lines as samples of `cpu`."""
    return [Sample(at, cpu, took) for at, took in read_sample_lines(path, 2)]


def read_sample_lines(path: Path | None, width: int) -> list[tuple[float, ...]]:
    """The lines a sampler process wrote to `path`, each `width` numbers; a line cut short when the sampler was
    stopped (or one that is not numbers) is skipped, and a file not (yet) there reads as no lines."""
    if path is None:
        return []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) != width:
            continue
        try:
            out.append(tuple(float(p) for p in parts))
        except ValueError:
            continue
    return out
