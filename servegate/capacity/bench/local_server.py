"""The manifest's own server, started for `gate bench MANIFEST` and `gate profile` on a free local port.

It runs `servegate.server.create_app(served)` on uvicorn in a child process: the bench's client and
the server under test then do not share one interpreter lock, so the client's bookkeeping cannot
slow the server down or the other way round (measured: with both in one process, the client's
scheduled sends slipped by milliseconds whenever the model ran).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.remote.server_process import free_port


class LocalServer:
    """`with LocalServer(served) as server: server.url` — the manifest served on 127.0.0.1 until the block ends."""

    def __init__(
        self,
        served: ServedModel,
        startup_timeout_s: float = 600.0,
        log_path: Path | None = None,
        step_trace: Path | None = None,
    ) -> None:
        """`step_trace`: a file the server's engine appends one line per step to (see runtime/engine/step_trace.py)."""
        self.served = served
        self.step_trace = step_trace
        self.port = free_port()
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs (None before launch() and after stop())."""
        return self._proc.pid if self._proc is not None else None

    @property
    def url(self) -> str:
        """Base URL of the OpenAI API (…/v1)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LocalServer:
        """Spawn the server (unless launch() already did) and wait until /ready answers 200 (the model loaded
        and warmed up)."""
        if self._proc is None:
            self.launch()
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        ready = f"http://127.0.0.1:{self.port}/ready"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServegateError(f"the local server exited with {self._proc.returncode}: {self._tail()}")
            try:
                answer = httpx.get(ready, timeout=2.0)
            except httpx.HTTPError:
                answer = None
            if answer is not None and answer.status_code == 200:
                return self
            failed = _failed_start(answer)
            if failed is not None:  # the model did not load or its warm-up failed: it will not become ready
                self.stop()
                raise ServegateError(f"the local server for {self.served.name} cannot serve: {failed}")
            time.sleep(0.2)
        self.stop()
        raise ServegateError(f"the local server was not ready after {self.startup_timeout_s:.0f} s: {self._tail()}")

    def launch(self) -> LocalServer:
        """Spawn the server process and return at once (start() then waits for it to be ready)."""
        self._tmp = tempfile.TemporaryDirectory(prefix="servegate-bench-")
        spec = Path(self._tmp.name) / "served.json"
        spec.write_text(
            json.dumps(
                {
                    "manifest": self.served.model_dump(mode="json"),
                    "base_dir": str(self.served.base_dir),
                    "path_bases": {value: str(folder) for value, folder in self.served._path_bases.items()},
                }
            ),
            encoding="utf-8",
        )
        log = open(self.log_path or Path(self._tmp.name) / "server.log", "wb")  # noqa: SIM115 - kept for the child
        self._log_file = log
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "servegate.capacity.bench.local_server", str(spec), str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self._trace_env()},
        )
        return self

    def _trace_env(self) -> dict[str, str]:
        from servegate.runtime.engine.step_trace import ENV

        return {ENV: str(self.step_trace)} if self.step_trace is not None else {}

    def peak_rss_bytes(self) -> int | None:
        """Peak resident memory of the server process so far (Linux VmHWM), bytes; None when unknown."""
        if self._proc is None:
            return None
        try:
            text = Path(f"/proc/{self._proc.pid}/status").read_text(encoding="utf-8")
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
        return None

    def _tail(self) -> str:
        if self._tmp is None:
            return ""
        path = self.log_path or Path(self._tmp.name) / "server.log"
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-3:])

    def stop(self) -> None:
        """Drain and stop the server (SIGTERM, then SIGKILL after 30 s)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if getattr(self, "_log_file", None) is not None:
            self._log_file.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _serve(spec_path: str, port: int) -> None:
    """Child process: rebuild the manifest and serve it with the server's graceful shutdown."""
    import uvicorn

    from servegate.server import create_app

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    served = ServedModel.model_validate(spec["manifest"])
    served._source = Path(spec["base_dir"]) / "manifest.yaml"  # relative paths resolve as in the original
    served._path_bases = {value: Path(folder) for value, folder in spec["path_bases"].items()}
    uvicorn.run(create_app(served), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _failed_start(answer: httpx.Response | None) -> str | None:
    """The reason a server that finished starting is not ready (None while it may still become ready)."""
    if answer is None or answer.status_code != 503:
        return None
    try:
        body = answer.json()
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("starting", True) or body.get("reason") == "shutting down":
        return None
    return str(body.get("reason") or "not ready")


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
