"""Where a check's time went: wall seconds per (gate, kind), measured with exclusive phases.

`gate check --profile-gates` prints the split. A phase (`with split.phase("model loads"):`) charges the wall
time it lasts to the current gate's row under its kind. Phases nest exclusively: when a phase starts inside
another (an engine loaded lazily while a suite runs), the outer phase's clock pauses until the inner one
ends, so no second is counted twice and a row's kinds add up to the time the row covered. Time inside a
gate but outside any phase (probes, scoring) is that gate's "other"; time outside every gate (loading the
suites, probing a remote, each gate's `prepare`, and closing the engines at the end) is the row "setup".

Threads and tasks: there is one timeline, the check's wall clock, and one stack of the phases open on it, kept
under a lock. The phase entered last and still open gets the time, whichever thread or asyncio task entered it,
and a phase leaving removes its own entry (not just the top one), so phases that end out of order (an engine's
start awaited in a server's start-up task while the check's coroutine waits for it) cannot corrupt the stack,
and concurrent work is never counted twice. Only the thread that created the split moves between gates.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

Kind = Literal[
    "model loads", "reference outputs", "candidate outputs", "divergence probe", "timing audits", "bench", "other"
]
KINDS: tuple[Kind, ...] = (
    "model loads",
    "reference outputs",
    "candidate outputs",
    "divergence probe",
    "timing audits",
    "bench",
    "other",
)
"""Every kind of time, in the order the profile table shows them."""

SETUP = "setup"
"""The row of the time spent outside every gate."""


def worker_setup(process: int) -> str:
    """The row of a `gate check --jobs` worker's own time outside its gates (process 2 and up)."""
    return f"{SETUP} (process {process})"


class TimeSplit:
    """Accumulates wall seconds per (gate, kind) with exclusive nesting (see the module doc)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._owner = threading.get_ident()
        self._lock = threading.Lock()
        self.started = clock()
        """When the split began (the clock's seconds): the check's time counts from here."""
        self._mark = self.started
        """Up to when the seconds so far have been charged."""
        self._gate = SETUP
        self._open: list[tuple[Kind, object]] = []
        """The phases open now, in the order they were entered, each with its own token."""
        self._seconds: dict[str, dict[Kind, float]] = {}

    def _charge(self) -> None:
        """Charge the seconds since the last mark to the current gate and the phase entered last ("other" when
        none is open); the caller holds the lock."""
        now = self._clock()
        kind: Kind = self._open[-1][0] if self._open else "other"
        row = self._seconds.setdefault(self._gate, {})
        row[kind] = row.get(kind, 0.0) + (now - self._mark)
        self._mark = now

    @contextmanager
    def phase(self, kind: Kind) -> Iterator[None]:
        """Charge the block's wall time to `kind` of the current gate, pausing the enclosing phase meanwhile."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind of time {kind!r}; one of {', '.join(KINDS)}")
        entry = (kind, object())
        with self._lock:
            self._charge()
            self._open.append(entry)
        try:
            yield
        finally:
            with self._lock:
                self._charge()
                self._open.remove(entry)  # its own entry: another task's phase may have opened after it

    @contextmanager
    def gate(self, name: str) -> Iterator[None]:
        """Charge the block's time to gate `name` (its phases by kind, the rest as "other"); from the thread that
        created the split (elsewhere the block runs uncharged to any gate of its own)."""
        if threading.get_ident() != self._owner:
            yield
            return
        with self._lock:
            self._charge()
            outer, self._gate = self._gate, name
        try:
            yield
        finally:
            with self._lock:
                self._charge()
                self._gate = outer

    def seconds(self) -> dict[str, dict[Kind, float]]:
        """Unrounded seconds so far: row (gate or "setup") -> kind -> seconds, only kinds that took time."""
        with self._lock:
            self._charge()
            rows = {row: {k: kinds[k] for k in KINDS if kinds.get(k)} for row, kinds in self._seconds.items()}
        return {row: kinds for row, kinds in rows.items() if kinds}

    def as_dict(self) -> dict[str, dict[str, float]]:
        """The split as reports hold it: row -> kind -> seconds rounded to 0.01 s (kinds that round to 0 left out)."""
        rounded = {row: {k: round(s, 2) for k, s in kinds.items()} for row, kinds in self.seconds().items()}
        return {row: {k: s for k, s in kinds.items() if s} for row, kinds in rounded.items()}

    def total(self) -> float:
        """Wall seconds since the split began, on its clock (not a sum of the rows, so tests can compare)."""
        return self._clock() - self.started
