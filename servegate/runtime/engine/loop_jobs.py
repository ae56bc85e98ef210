"""Work that must run on the reference engine's loop thread between steps (prompt scoring).

The loop thread owns the model: it loaded it, and its OpenMP pool is the warm one (reference.py). A job
queued here runs there between two steps, so it never races a step for the model or the cores.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class LoopJobs:
    """A queue of callables run by the loop thread; callers block until theirs ran."""

    def __init__(self, wake: threading.Condition) -> None:
        """`wake`: the loop's condition, notified when a job arrives."""
        self._wake = wake
        self._lock = threading.Lock()
        self._jobs: list[tuple[Callable[[], Any], list[Any], threading.Event]] = []

    @property
    def pending(self) -> bool:
        """Whether a job waits to run."""
        with self._lock:
            return bool(self._jobs)

    def put(self, job: Callable[[], Any]) -> tuple[list[Any], threading.Event]:
        """Queue `job`; returns its result box and the event set once it ran."""
        box: list[Any] = []
        done = threading.Event()
        with self._lock:
            self._jobs.append((job, box, done))
        with self._wake:
            self._wake.notify_all()
        return box, done

    def run(self) -> bool:
        """Run every queued job (on the calling thread); False when there was none."""
        with self._lock:
            jobs, self._jobs = self._jobs, []
        for job, box, done in jobs:
            try:
                box.append(job())
            except BaseException as exc:  # handed back to the caller waiting on it
                box.append(exc)
            done.set()
        return bool(jobs)

    def cancel(self, error: BaseException) -> None:
        """End every queued job with `error` (the loop stopped)."""
        with self._lock:
            jobs, self._jobs = self._jobs, []
        for _, box, done in jobs:
            box.append(error)
            done.set()


def result_of(box: list[Any], done: threading.Event) -> Any:
    """Wait for a job and return its result (re-raising what it raised)."""
    done.wait()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]
