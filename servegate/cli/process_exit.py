"""Ending a `gate` process without the interpreter's module teardown.

At a normal exit CPython frees every imported module one by one. With torch, torchao and transformers'
model code imported, that alone took 1.3-1.6 s of each `gate check` (2026-12-06, AMD EPYC, 2 cores: a script
that only imports what the check imports spent 5.7 s importing and 1.6 s more before the process ended). By
the time a command returns, everything it wrote is closed; what a normal exit still does that matters is run
the exit handlers (logging's flush, multiprocessing's children, weakref finalizers such as temporary folders,
coverage's data file) and flush the standard streams. This module does exactly that, then ends the process.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def exit_status(code: object) -> int:
    """The process status Python gives `SystemExit(code)`: None is 0, an int is itself, anything else is
    printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_then_exit(main: Callable[[], object]) -> NoReturn:
    """Run `main` and end the process with its exit status, skipping the module teardown.

    An exception other than SystemExit propagates as usual (Python prints it and exits 1). A non-daemon
    thread still running would be joined by a normal exit, so then the exit is the normal one.
    """
    try:
        main()
        status = 0
    except SystemExit as done:
        status = exit_status(done.code)
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(status)
    atexit._run_exitfuncs()  # the handlers a normal exit runs, in the same order (last registered first)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it anyway
            pass
    os._exit(status)
