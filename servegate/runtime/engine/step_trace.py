"""An optional record of every engine step while serving, for calibrating the capacity planner.

`gate profile` starts the manifest's server with SERVEGATE_STEP_TRACE set to a file path; the server
opens the trace (`open_step_trace`) and hands it to the engine it builds, which then appends one JSON
line per step: when it began and ended (seconds on the perf_counter clock), the chunks it computed as
(new tokens, tokens already cached) pairs, how many requests were admitted while it ran and how many it
answered. Steps measured inside the serving process include what a bare model step does not:
scheduling, sampling, streaming, and the HTTP work that competes for the same interpreter.
The engine also appends one line per request its queue bound decided on: the request's id and when it was
admitted (`admitted`) or refused (`refused`), on the same clock, so a replay can take each request's measured
way from the client into the engine (capacity/latency/replay.py), and, per request, when its first token
(`first_token`) and its final event (`finished`) were handed to its sink (engine/delivery.py), so a replay can take
the measured way back out to the client too. Traces written before 2026-12-02 hold steps only, or steps and
admissions.
Unset (the default), the engine records nothing and pays nothing.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import IO, Any

ENV = "SERVEGATE_STEP_TRACE"
"""Environment variable naming the trace file."""


class StepTrace:
    """Appends step, admission and handoff records to a file, one JSON object per line."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] | None = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - held open
        self._lock = threading.Lock()
        """Steps come from the loop thread, admissions and handoffs from any thread: one line at a time."""

    def record(self, plan: Any, began: float, ended: float, arrivals: int, completed: int = 0) -> None:
        """One step: its scheduler output, start and end (perf_counter seconds), requests admitted meanwhile,
        requests it answered."""
        chunks = [[c.num_tokens, c.start_pos] for c in plan.chunks]
        self._write({"began": began, "ended": ended, "chunks": chunks, "arrivals": arrivals, "completed": completed})

    def admission(self, request_id: str, at: float, admitted: bool = True) -> None:
        """One request the engine's queue bound admitted (or refused) at `at` (perf_counter seconds)."""
        self._write({"request": request_id, "admitted" if admitted else "refused": at})

    def handoff(self, request_id: str, event: str, at: float) -> None:
        """Request `request_id`'s `first_token` or `finished` (its final event) handed to its sink at `at`."""
        self._write({"request": request_id, event: at})

    def _write(self, record: dict[str, Any]) -> None:
        """Append one line (nothing once closed)."""
        line = json.dumps(record) + "\n"
        with self._lock:
            if self._file is not None:
                self._file.write(line)

    def close(self) -> None:
        """Flush and close the file (later records are dropped)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def open_step_trace() -> StepTrace | None:
    """The trace SERVEGATE_STEP_TRACE asks for, or None."""
    path = os.environ.get(ENV)
    return StepTrace(Path(path)) if path else None


def read_step_trace(path: Path) -> list[dict[str, Any]]:
    """The step records of a trace file (a torn last line, from a killed server, is skipped)."""
    return [r for r in _read_lines(path) if "began" in r]


def read_admissions(path: Path) -> list[dict[str, Any]]:
    """The admission records of a trace file, in the order the engine decided (none in a trace written before
    the engine recorded them)."""
    return [r for r in _read_lines(path) if "request" in r and ("admitted" in r or "refused" in r)]


def read_handoffs(path: Path) -> list[dict[str, Any]]:
    """The records of when each request's first token and final event went to its sink (none in a trace
    written before the engine recorded them)."""
    return [r for r in _read_lines(path) if "request" in r and ("first_token" in r or "finished" in r)]


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """Every JSON line of a trace file that parses."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
