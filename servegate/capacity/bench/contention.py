"""Whether the server's threads got their cores while it was benched: a timed torch probe beside the bench,
and the time the server's own threads spent waiting for a core.

The Python loop of machine_speed.py times how fast one core runs, for a fraction of a millisecond, so it
cannot see the two ways other processes slow a CPU server down (benchmarks/README.md, "Threads and
contention"): a neighbour that holds a core for whole scheduler slices, and a thread team that stalls.
torch runs each parallel op on its team of `runtime.threads` OpenMP threads and waits at the op's end for
the slowest; when a neighbour holds one of the team's cores, every op waits for that thread to be scheduled
again. Measured on the 2-core VM with two spinning processes at nice 19 beside it: the quickstart's decode
steps went from 4 ms on one thread to 250 ms on two, while the Python loop stayed within 10%.

- The probe: a process that does what the server's steps do, on the same team size. Every `interval_s`
  it runs a few parallel torch ops (an elementwise op past torch's grain size and a small matrix
  product) on `threads` threads, then the same ops on one thread, and writes both wall times.
  `team_over_single`, the team's mean time over the single thread's, is below 1 on idle cores (the team
  splits the work); above TEAM_STALL the team lost more than its parallelism gave it: contended. A
  one-thread runtime has no team to stall, and gets no probe.
- The wait: Linux counts, per thread, the time it was runnable but not running (/proc/PID/task/*/schedstat).
  Over the bench, the server's threads' waiting over their running and waiting is the share of the time
  they wanted a core and had none; above WAIT_SHARE the server was contended, whatever its thread count.

The probe costs 1-3% of a core (about 2 ms every 100 ms), waits for `begin()` before it samples, and
exits on its own when the process that started it dies. Start it early (`launch()`): torch's import
takes seconds of CPU on a busy machine, which should not fall in the bench.
"""

from __future__ import annotations

import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from servegate.capacity.bench.machine_speed import read_sample_lines

INTERVAL_S = 0.1
"""Seconds the probe sleeps between samples."""
TEAM_STALL = 2.0
"""The team ran the probe's ops more than this many times slower than one thread: its cores were taken."""
WAIT_SHARE = 0.25
"""The server's threads waited for a core more than this share of the time they wanted one: contended."""
MIN_SAMPLES = 3
"""Fewer probe samples in a window say nothing about the team (a stalled team takes long over each)."""
READY_TIMEOUT_S = 60.0
"""How long begin() waits for the probe to have imported torch and warmed up."""

_PROBE = """
import os, sys, time
import torch
threads, interval, parent, path = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
x, w = torch.randn(64, 1024), torch.randn(1024, 192)
def timed(t):
    torch.set_num_threads(t)
    began = time.perf_counter()
    for _ in range(2):  # few ops: a stalled team takes long over each, and the window still needs samples
        y = torch.nn.functional.silu(x) * x  # 65,536 elements: past the grain size, the team splits it
        y @ w
    return (time.perf_counter() - began) * 1e6
for _ in range(3):
    timed(threads), timed(1)
print("ready", flush=True)
if sys.stdin.readline() == "":
    sys.exit(0)
with open(path, "w", buffering=1) as out:
    while os.getppid() == parent:
        team = timed(threads)
        out.write(f"{time.time():.4f} {team:.1f} {timed(1):.1f}\\n")
        time.sleep(interval)
"""
"""The probe's program (run with -I): warm up, say `ready`, wait for a line on stdin, then one sample per interval,
"wall-clock seconds, team us, one thread us" per line, until its parent is gone."""


@dataclass(frozen=True)
class ProbeSample:
    """One round of the probe."""

    at: float
    """Wall-clock time it ended (time.time())."""
    team_us: float
    """The ops on the team."""
    single_us: float
    """The same ops on one thread."""


@dataclass(frozen=True)
class Contention:
    """Whether the server's cores were contended over one stretch of time, and the figures behind it."""

    threads: int
    """The server's torch threads (the team size probed)."""
    samples: int
    """Probe samples (0: no probe, a one-thread runtime or one that did not start in time)."""
    team_ms: float | None = None
    """Median time of the probe's ops on the team."""
    team_p90_ms: float | None = None
    single_ms: float | None = None
    """Median time of the same ops on one thread."""
    team_over_single: float | None = None
    """Mean team time over mean single time."""
    wait_share: float | None = None
    """The server's threads' run-queue wait over their run plus wait time (None: not a process here)."""
    reasons: list[str] = field(default_factory=list)
    """Why the cores count as contended (empty: they do not)."""

    @property
    def contended(self) -> bool:
        """Whether the server's cores were taken (any reason)."""
        return bool(self.reasons)

    def describe(self) -> str:
        """One line with the figures and the verdict."""
        parts = []
        if self.team_ms is not None and self.team_over_single is not None:
            parts.append(
                f"{self.threads} torch threads ran the probe's ops in {self.team_ms:.3g} ms (median; p90 "
                f"{self.team_p90_ms:.3g} ms), one thread in {self.single_ms:.3g} ms: {self.team_over_single:.2f}x "
                f"({self.samples} samples)"
            )
        if self.wait_share is not None:
            parts.append(f"the server's threads waited for a core {100 * self.wait_share:.0f}% of the time")
        verdict = f": CONTENDED ({'; '.join(self.reasons)})" if self.reasons else ": cores held"
        return ("; ".join(parts) or "not measured") + verdict

    def as_dict(self) -> dict[str, Any]:
        """The plain JSON form."""
        return {
            "threads": self.threads,
            "samples": self.samples,
            "team_ms": self.team_ms,
            "team_p90_ms": self.team_p90_ms,
            "single_ms": self.single_ms,
            "team_over_single": self.team_over_single,
            "wait_share": self.wait_share,
            "contended": self.contended,
            "reasons": list(self.reasons),
            "probe": f"parallel torch ops on {self.threads} threads, then on one, every {INTERVAL_S:g} s"
            if self.threads > 1
            else "none: a one-thread runtime has no team to stall (its run-queue wait is measured)",
        }


def judge_contention(samples: list[ProbeSample], threads: int, wait_share: float | None = None) -> Contention:
    """The verdict from the probe's samples of a stretch and the server's run-queue wait share over it."""
    reasons: list[str] = []
    out: dict[str, Any] = {}
    if len(samples) >= MIN_SAMPLES and threads > 1:
        team = sorted(s.team_us / 1000 for s in samples)
        single = [s.single_us / 1000 for s in samples]
        ratio = statistics.fmean(team) / statistics.fmean(single)
        out = {"team_ms": statistics.median(team), "team_p90_ms": team[min(len(team) - 1, int(0.9 * len(team)))],
               "single_ms": statistics.median(single), "team_over_single": ratio}  # fmt: skip
        if ratio > TEAM_STALL:
            reasons.append(
                f"its {threads}-thread team ran the probe {ratio:.1f}x slower than one thread (over {TEAM_STALL:g}x: "
                "a neighbour held its cores and each parallel op waited for it)"
            )
    if wait_share is not None and wait_share > WAIT_SHARE:
        reasons.append(
            f"its threads waited for a core {100 * wait_share:.0f}% of the time (over {100 * WAIT_SHARE:.0f}%)"
        )
    return Contention(threads, len(samples), wait_share=wait_share, reasons=reasons, **out)


def run_queue_times(pid: int) -> tuple[int, int] | None:
    """Nanoseconds the threads of process `pid` have run and waited runnable for a core (Linux schedstat,
    summed over its threads); None where the kernel does not say."""
    run = wait = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except OSError:  # the thread ended meanwhile
            continue
        run, wait = run + int(fields[0]), wait + int(fields[1])
    return (run, wait) if tasks else None


def wait_share_between(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of run-queue wait in what the threads did between two run_queue_times readings."""
    if before is None or after is None:
        return None
    run, wait = after[0] - before[0], after[1] - before[1]
    return wait / (run + wait) if run + wait > 0 and wait >= 0 else None


class ContentionProbe:
    """The probe process for a team of `threads`: `launch()` early (it imports torch and warms up), `begin()`
    when the bench starts, `samples_between(began, ended)` for a stretch, `stop()` at the end. A team of one
    gets no process (nothing to stall)."""

    def __init__(self, threads: int, interval_s: float = INTERVAL_S) -> None:
        self.threads = max(1, threads)
        self.interval_s = interval_s
        self.samples: list[ProbeSample] = []
        self._proc: subprocess.Popen[str] | None = None
        self._dir: Path | None = None
        self._path: Path | None = None
        self._ready = False

    def launch(self) -> ContentionProbe:
        """Start the probe process (a team of two or more); it warms up and waits for begin()."""
        if self._proc is not None or self.threads < 2:
            return self
        self._dir = Path(tempfile.mkdtemp(prefix="servegate-contention-"))
        self._path = self._dir / "probe.txt"
        args = [str(self.threads), str(self.interval_s), str(os.getpid()), str(self._path)]
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _PROBE, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        return self

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Wait at most `timeout_s` for the probe to have imported torch and warmed up; whether it has (a team of
        one has no probe to wait for)."""
        self.launch()
        if self._proc is not None and self._proc.stdout is not None and not self._ready:
            ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
            self._ready = bool(ready) and self._proc.stdout.readline().strip() == "ready"
        return self._ready or self._proc is None

    def begin(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start sampling once the probe is warm (wait_ready(timeout_s): a probe that is not ready by then samples
        late or not at all, and the verdict says so)."""
        self.wait_ready(timeout_s)
        if self._proc is None:
            return
        stdin: IO[str] | None = self._proc.stdin
        if stdin is not None:
            try:
                stdin.write("go\n")
                stdin.flush()
            except OSError:  # the probe died: there are no samples, and the verdict says so
                pass

    def stop(self) -> list[ProbeSample]:
        """Stop the probe and collect its samples (also kept in `samples`)."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                try:
                    if pipe is not None:
                        pipe.close()
                except OSError:
                    pass
            self.samples = _read(self._path)
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        return self.samples

    def samples_between(self, began: float | None = None, ended: float | None = None) -> list[ProbeSample]:
        """The samples taken between `began` and `ended` (wall-clock seconds; open when None)."""
        samples = _read(self._path) if self._proc is not None else self.samples
        return [s for s in samples if (began is None or s.at >= began) and (ended is None or s.at <= ended)]

    def __enter__(self) -> ContentionProbe:
        self.begin()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read(path: Path | None) -> list[ProbeSample]:
    """The probe's lines as samples."""
    return [ProbeSample(*numbers) for numbers in read_sample_lines(path, 3)]
