"""A server process under test on 127.0.0.1: a subprocess (`gate serve`, the fault-engine server) or a job forked
by the reliability tests' fork server; its stdout and stderr go to a log file the tests read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import IO, Any

import httpx

from servegate.runtime.remote.server_process import free_port
from support.manifests import write_manifest

GATE = Path(sys.executable).with_name("gate")
"""The `gate` command of the interpreter running the tests."""


class ServerProcess:
    """One server process listening on `port`; `process` is the Popen or multiprocessing process it runs in."""

    def __init__(
        self,
        process: subprocess.Popen[bytes] | BaseProcess,
        log_path: Path,
        port: int,
        cwd: Path | None = None,
        log_file: IO[bytes] | None = None,
    ) -> None:
        self.process = process
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.cwd = cwd
        """The server's working directory, when the test chose one."""
        self._log_file = log_file

    @classmethod
    def spawn(cls, command: list[str], log_path: Path, port: int) -> ServerProcess:
        """Run `command` as a subprocess (tracebacks off, output unbuffered into `log_path`)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SERVEGATE_DEBUG": ""}
        log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        return cls(process, log_path, port, log_file=log)

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self.process.pid is not None
        return self.process.pid

    def alive(self) -> bool:
        """Whether the process still runs."""
        if isinstance(self.process, subprocess.Popen):
            return self.process.poll() is None
        return self.process.is_alive()

    def exit_code(self) -> int | None:
        """The exit code (negative: the signal that ended it), None while it runs."""
        if isinstance(self.process, subprocess.Popen):
            return self.process.poll()
        return self.process.exitcode

    def url(self, path: str) -> str:
        """Absolute URL of a path on this server."""
        return self.base_url + path

    def log(self) -> str:
        """Everything the server printed so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def wait_until(self, path: str, status: int, timeout_s: float = 120.0) -> None:
        """Poll GET path until it answers `status` (the process dying or the time passing fails the test)."""
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise AssertionError(f"server exited with {self.exit_code()}:\n{self.log()[-4000:]}")
            try:
                last = httpx.get(self.url(path), timeout=5.0).status_code
                if last == status:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"GET {path} never answered {status} (last {last}):\n{self.log()[-4000:]}")

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Poll /ready until it answers 200."""
        self.wait_until("/ready", 200, timeout_s)

    def _wait(self, timeout_s: float) -> None:
        if isinstance(self.process, subprocess.Popen):
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        else:
            self.process.join(timeout_s)

    def kill(self) -> int | None:
        """SIGKILL: no drain, no cleanup; returns the exit code (-9)."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self._wait(30)
        return self.exit_code()

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, wait for the exit, return the exit code (SIGKILL after timeout_s)."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            self._wait(timeout_s)
        if self.alive():
            self.kill()
        if self._log_file is not None:
            self._log_file.close()
        return self.exit_code()


def start_fake_server(folder: Path, manifest: dict[str, Any], behaviour: dict[str, Any] | None = None) -> ServerProcess:
    """The fault-engine server (support/serve_fault_engine.py) on a free port: the same app and runner as
    `gate serve`, with the faults `behaviour` names (FakeBehaviour's fields)."""
    path = write_manifest(folder, manifest)
    port = free_port()
    script = Path(__file__).with_name("serve_fault_engine.py")
    command = [sys.executable, str(script), str(path), str(port), json.dumps(behaviour or {})]
    return ServerProcess.spawn(command, folder / "server.log", port)


def start_gate_serve(folder: Path, manifest: dict[str, Any], *extra: str) -> ServerProcess:
    """`gate serve MANIFEST --port N` on a free port."""
    path = write_manifest(folder, manifest)
    port = free_port()
    command = [str(GATE), "serve", str(path), "--host", "127.0.0.1", "--port", str(port), *extra]
    return ServerProcess.spawn(command, folder / "server.log", port)


def ready_app(served: Any, timeout_s: float = 120.0) -> Iterator[Any]:
    """servegate's app for `served` in process (a fastapi TestClient), yielded once /ready answers 200."""
    from fastapi.testclient import TestClient

    from servegate.server import create_app

    with TestClient(create_app(served)) as client:
        deadline = time.monotonic() + timeout_s
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, f"the app did not get ready: {client.get('/ready').text}"
            time.sleep(0.2)
        yield client
