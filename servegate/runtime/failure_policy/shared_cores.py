"""A fallback engine in the primary's process: the CPU cores the two share.

Each engine runs its steps on its own loop thread, and torch's OpenMP keeps a pool of worker threads
for every thread that ran a parallel op. Once the pools hold more threads than the machine has cores,
libgomp stops spinning idle workers between ops and wakes them for each one, which slows every step of
the primary even while the fallback sits idle: measured on a 2-core VM with the quickstart's fallback
(2 threads) beside a compiled 134M-parameter primary (2 threads), batch-1 decode through the engine
fell from 26.8-28.2 to 16.4-20.5 tokens/s (benchmarks/README.md). So a fallback on CPU beside a
primary on CPU gets at most the cores the primary leaves, and at least one thread (one thread keeps
no pool of workers at all).
"""

from __future__ import annotations

import logging

from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel

log = logging.getLogger("servegate.runtime")

_said: set[tuple[str, int | None, str]] = set()
"""Fallbacks whose lowered threads were already reported at WARNING in this process."""


def fallback_threads(primary_threads: int | None, declared: int | None, cores: int, default: int) -> int | None:
    """The torch threads the fallback gets: its `declared` `runtime.threads` (None: the runtime's `default`),
    lowered to what the primary's threads (None: `default`) leave of `cores` but never below 1; None when
    left as declared."""
    wanted = declared or default
    room = max(1, cores - (primary_threads or default))
    return room if wanted > room else declared


def beside_primary(primary: ServedModel, fallback: ServedModel) -> ServedModel:
    """The fallback manifest as it runs beside `primary` in one process: its threads capped (see above)
    when both run on CPU, with a warning saying so; unchanged otherwise."""
    from servegate.runtime.model.cpu_linear import TORCH_DEFAULT_THREADS, default_threads

    if primary.runtime.remote or fallback.runtime.remote:
        return fallback
    if not (_on_cpu(primary) and _on_cpu(fallback)):
        return fallback
    default = default_threads()
    threads = fallback_threads(primary.runtime.threads, fallback.runtime.threads, TORCH_DEFAULT_THREADS, default)
    if threads == fallback.runtime.threads:
        return fallback
    declared = fallback.runtime.threads or f"the default ({default})"
    said = (fallback.name, threads, str(declared))
    # gate check builds the same engine several times: say it once per process
    (log.info if said in _said else log.warning)(
        "fallback %s runs on %d torch thread(s), not %s: the primary's %d of this machine's %d cores leave no more "
        "(two engines' thread pools past the cores slow every step of the primary)",
        fallback.name,
        threads,
        declared,
        primary.runtime.threads or default,
        TORCH_DEFAULT_THREADS,
    )
    _said.add(said)
    return fallback.with_changes(runtime=fallback.runtime.model_copy(update={"threads": threads}))


def _on_cpu(served: ServedModel) -> bool:
    from servegate.runtime.model.weights import resolve_device

    try:
        return resolve_device(served.runtime.device).type == "cpu"
    except ServegateError:  # cuda declared on a machine without one: loading the model says so
        return False
