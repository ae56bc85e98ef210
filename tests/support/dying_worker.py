"""Worker functions for `gate check --jobs` tests: they run in a spawned process, so they live in a module."""

from __future__ import annotations

import os

from servegate.gates.gate_jobs import WorkerOutcome, WorkerTask, work


def dies_in_process_2(task: WorkerTask) -> WorkerOutcome:
    """End worker process 2 at once, as the kernel's out-of-memory killer would; any other runs its gates."""
    if task.process == 2:
        os._exit(3)
    return work(task)


def has_a_bug(task: WorkerTask) -> WorkerOutcome:
    """Raise a programming error, which a check must not turn into a verdict."""
    raise TypeError(f"a bug in process {task.process}")
