"""Worker functions for `gate check --jobs` tests: they run in a spawned process, so they live in a module."""

from __future__ import annotations

import os

from servegate.gates.gate_jobs import WorkerOutcome, WorkerTask


def dies(task: WorkerTask) -> WorkerOutcome:
    """End the worker process at once, as the kernel's out-of-memory killer would."""
    os._exit(3)


def has_a_bug(task: WorkerTask) -> WorkerOutcome:
    """Raise a programming error, which a check must not turn into a verdict."""
    raise TypeError(f"a bug in process {task.process}")
