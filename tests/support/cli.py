"""The real `gate` entry point run in process on fake engines, for tests of the command line."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from support.oracle_engine import fake_factory

GateRun = Callable[..., tuple[int, str, str]]
"""`gate(*args)` -> (exit code, stdout, stderr)."""


def in_process_gate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> GateRun:
    """A runner of `gate ARGS...` through servegate.cli.app.main on the oracle's fake engines, with the output
    cache under `tmp_path` and a wide terminal."""
    import servegate.gates.base as gates_base
    from servegate.cli.app import main

    monkeypatch.setattr(gates_base, "default_engine_factory", fake_factory())
    monkeypatch.setenv("SERVEGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["gate", *args])
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run
