"""Server processes for the reliability tests: `gate serve` (or a slowed copy) on a free 127.0.0.1 port."""

from __future__ import annotations

import os
import signal
import socket
import time
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import httpx
import reliability_jobs
from reliability_engine import write_manifest


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """One server process; its stdout and stderr go to `log_path`, its working directory is `cwd`."""

    def __init__(self, process: BaseProcess, log_path: Path, port: int, cwd: Path) -> None:
        self.process = process
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.cwd = cwd

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self.process.pid is not None
        return self.process.pid

    def url(self, path: str) -> str:
        """Absolute URL of a path on this server."""
        return self.base_url + path

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Poll /ready until 200 (the process dying or the time passing raises AssertionError)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.process.is_alive():
                raise AssertionError(f"server exited with {self.process.exitcode}:\n{self.log()[-4000:]}")
            try:
                if httpx.get(self.url("/ready"), timeout=5.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"/ready never answered 200:\n{self.log()[-4000:]}")

    def log(self) -> str:
        """Everything the server printed so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def kill(self) -> int | None:
        """SIGKILL: no drain, no cleanup; returns the exit code (-9)."""
        if self.process.is_alive():
            os.kill(self.pid, signal.SIGKILL)
        self.process.join(30)
        return self.process.exitcode

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, wait for the exit, return the exit code (SIGKILL after timeout_s)."""
        if self.process.is_alive():
            os.kill(self.pid, signal.SIGTERM)
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.kill()
        return self.process.exitcode


def start_server(folder: Path, manifest: dict[str, Any], step_delay_s: float = 0.0) -> ServerProcess:
    """`gate serve MANIFEST --port N` (a slowed copy when step_delay_s > 0), working in `folder`; not yet ready."""
    folder.mkdir(parents=True, exist_ok=True)
    path = write_manifest(folder, manifest)
    port, log = free_port(), folder / "server.log"
    if step_delay_s > 0:
        process = reliability_jobs.start("serve_slowed", str(path), port, step_delay_s, str(log), str(folder))
    else:
        argv = ["serve", str(path), "--host", "127.0.0.1", "--port", str(port)]
        process = reliability_jobs.start("gate_main", argv, str(log), str(folder))
    return ServerProcess(process, log, port, folder)
