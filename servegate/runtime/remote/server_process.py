"""An engine server servegate starts as a child process group: vLLM's and llama.cpp's share this.

`ChildServer` starts the launch's command in its own session (so stopping it stops every process it forks:
vLLM's engine core and workers), streams its output to a log file, reads the log and `/metrics`, measures the
group's resident memory and stops the group. Each engine's module adds only what differs: how it is launched
and how readiness is judged (vllm_process.py, llamacpp_process.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, ClassVar, Protocol

import httpx
from typing_extensions import Self


class Launch(Protocol):
    """What a ChildServer starts: its command line, environment and where it listens."""

    @property
    def base_url(self) -> str:
        """The server's root URL."""
        ...

    def command(self) -> list[str]:
        """The server's command line."""
        ...

    def environment(self, base: Mapping[str, str] = os.environ) -> dict[str, str]:
        """The server's environment."""
        ...


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ChildServer:
    """One running engine server: `start()`, the subclass's `wait_ready()`, `stop()` (or a context manager)."""

    launch_error: ClassVar[type[RuntimeError]] = RuntimeError
    """The error a start or readiness failure raises (the engine's own launch error)."""
    stop_grace_s: ClassVar[float] = 10.0
    """Seconds between SIGTERM and SIGKILL when stopping."""

    def __init__(self, launch: Launch, log_path: Path) -> None:
        self.launch = launch
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.ready_after_s: float | None = None
        """Seconds from start() to the readiness answer that made it ready."""
        self._log: IO[bytes] | None = None

    def prepare(self) -> None:
        """Folders the server needs before it starts (none here)."""

    def start(self) -> None:
        """Start the server in its own process group, its stdout and stderr streamed to `log_path`."""
        if self.process is not None:
            raise self.launch_error("this server was already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.prepare()
        self._log = self.log_path.open("wb")
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            self.launch.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.launch.environment(),
            start_new_session=True,
        )

    def log_text(self) -> str:
        """Everything the server has written so far."""
        if self._log is not None:
            self._log.flush()
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> list[str]:
        """The last `lines` lines of the server log."""
        return self.log_text().splitlines()[-lines:]

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """The server's /metrics as {sample name: [(labels, value), ...]} (Prometheus text format)."""
        resp = httpx.get(self.launch.base_url + "/metrics", timeout=30.0)
        resp.raise_for_status()
        return parse_metrics(resp.text)

    def group_rss_bytes(self) -> int | None:
        """Resident memory of every process in the server's group, bytes (None before start or when none)."""
        if self.process is None:
            return None
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # a process that ended while we looked
            if int(fields[2]) == self.process.pid:  # field 5 of stat: the process group id
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: resident pages
        return total or None

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM the whole process group, SIGKILL it after grace_s; returns the server's exit status."""
        process, self.process = self.process, None
        status = stop_group(process, self.stop_grace_s if grace_s is None else grace_s) if process else None
        if self._log is not None:
            self._log.close()
            self._log = None
        return status

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition as {sample name: [(labels, value), ...]}, in the order given."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def stop_group(process: subprocess.Popen[bytes], grace_s: float) -> int | None:
    """Stop a child started with start_new_session and everything in its group (engine core, workers)."""
    pgid = process.pid  # start_new_session makes the child its group's leader
    _signal_group(pgid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        process.poll()  # reap the leader, or its zombie keeps the group alive
        if not _signal_group(pgid, 0):
            return process.returncode
        time.sleep(0.2)
    _signal_group(pgid, signal.SIGKILL)
    try:
        process.wait(timeout=10.0)
    except subprocess.TimeoutExpired:
        pass
    return process.poll()


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to group `pgid` (0 only checks); False when no process is left in it."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process we may not signal is still there
        return True
    return True
