"""Processes the reliability tests start, kill and restart: `gate serve`, `gate run`, a slowed server.

Each job is a real OS process (its own pid, memory, signals and exit code) forked from a multiprocessing
fork server that imported torch, transformers and servegate once, so a kill-and-restart costs a fork,
not the ~10 s of CPU a fresh interpreter spends importing them. The jobs run the CLI's own entry point
(`servegate.cli.app.main` with the same argv a user types) or, for the slowed server, the same app and
runner `gate serve` uses. stdout and stderr go to a log file; the working directory is set per job.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path

# Everything below is imported once, in the fork server; each job starts with it loaded.
import rich.progress  # noqa: F401
import torch  # noqa: F401
import transformers  # noqa: F401
import uvicorn  # noqa: F401
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: F401

import servegate.cli.app  # noqa: F401
import servegate.runtime.engine.offline  # noqa: F401
import servegate.runtime.engine.reference  # noqa: F401
import servegate.runtime.model.model_runner  # noqa: F401
import servegate.runtime.model.sampling  # noqa: F401
import servegate.runtime.model.weights  # noqa: F401
import servegate.runtime.postprocess  # noqa: F401
import servegate.runtime.preprocess  # noqa: F401
import servegate.server  # noqa: F401
import servegate.zoo  # noqa: F401

_CONTEXT: ForkServerContext | None = None


def _context() -> ForkServerContext:
    global _CONTEXT
    if _CONTEXT is None:
        from multiprocessing import forkserver

        context: ForkServerContext = multiprocessing.get_context("forkserver")  # type: ignore[assignment]
        context.set_forkserver_preload([__name__])
        # The fork server must import this module, but Python 3.11 does not hand it the parent's sys.path
        # (its preload then fails silently and every job imports torch itself): PYTHONPATH does, while it starts.
        previous = os.environ.get("PYTHONPATH")
        here = Path(__file__).resolve().parent  # and tests/, where the jobs' helpers import `support` from
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(here), str(here.parent), previous]))
        try:
            forkserver.ensure_running()
        finally:
            if previous is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = previous
        _CONTEXT = context
    return _CONTEXT


def _redirect(log_path: str, cwd: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(cwd)
    os.environ["PYTHONUNBUFFERED"] = "1"
    os.environ.pop("SERVEGATE_DEBUG", None)


def gate_main(argv: list[str], log_path: str, cwd: str) -> None:
    """`gate ARGV...` exactly as typed (exit code: the command's)."""
    _redirect(log_path, cwd)
    sys.argv = ["gate", *argv]
    from servegate.cli.app import main

    main()


def serve_slowed(manifest: str, port: int, step_delay_s: float, log_path: str, cwd: str) -> None:
    """`gate serve MANIFEST` on `port`, every model step `step_delay_s` slower (same app, runner and drain)."""
    _redirect(log_path, cwd)
    from reliability_engine import reference_engine

    from servegate.contracts.loading import load_manifest
    from servegate.server import create_app, serve

    served = load_manifest(manifest, [])
    grace = served.failure_policy.request_timeout_s
    serve(create_app(served, reference_engine(served, step_delay_s=step_delay_s)), "127.0.0.1", port, grace)


def start(target: str, *args: object) -> BaseProcess:
    """Start job `target` (a function of this module) with `args` in a new process."""
    process = _context().Process(target=globals()[target], args=args, daemon=False)
    process.start()
    return process
