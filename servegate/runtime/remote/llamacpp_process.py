"""Start llama.cpp's `llama-server` as a child process group, wait until it really generates, stop it.

Used by `runtime.backend: llamacpp` (runtime/remote/llamacpp_backend.py) and the engines tests. Readiness is
`/health` answering 200 (503 while the model loads), then greedy completions of the warm-up prompts with
their expected outputs. The server gets its own process group, stopped whole (as vLLM's is).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from servegate.runtime.remote.llamacpp_args import NEUTRAL_SAMPLING, command_line
from servegate.runtime.remote.server_process import ChildServer

LLAMACPP_SERVER_ENV = "SERVEGATE_LLAMACPP_SERVER"
"""Environment variable naming the `llama-server` binary."""
MAKE_TARGET = "make llamacpp"
"""The make target that builds the binary into .venvs/llamacpp/bin."""
GREEDY: dict[str, Any] = {"temperature": 0, **NEUTRAL_SAMPLING}
"""Request fields that make a llama-server completion greedy whatever its server defaults."""


class LlamaCppLaunchError(RuntimeError):
    """llama-server did not become ready: it exited, answered an error, or the wait timed out."""


def find_server(named: str | None, roots: Sequence[Path], environ: Mapping[str, str] = os.environ) -> Path | None:
    """The llama-server binary: `named`, else $SERVEGATE_LLAMACPP_SERVER, else <root>/.venvs/llamacpp/bin/llama-server
    under each root in turn; None when none is an executable file."""
    named = named or environ.get(LLAMACPP_SERVER_ENV)
    candidates = [Path(named)] if named else [r / ".venvs" / "llamacpp" / "bin" / "llama-server" for r in roots]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass(frozen=True)
class LlamaCppLaunch:
    """What to start: the binary and the arguments the manifest maps to (model, alias, host and port here)."""

    binary: Path
    """The llama-server executable."""
    args: Mapping[str, Any]
    """Arguments by long name without dashes (`True`: a bare flag), from llamacpp_args.server_args."""
    port: int
    """TCP port on `host`."""
    host: str = "127.0.0.1"
    """Interface to listen on."""
    extra_args: tuple[str, ...] = ()
    """Further arguments, passed as given."""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Further environment variables."""

    @property
    def served_model_name(self) -> str:
        """The model name `/v1/models` lists (`--alias`)."""
        return str(self.args["alias"])

    @property
    def base_url(self) -> str:
        """The server's root URL (routes: /health, /props, /slots, /metrics, /tokenize, /v1/...)."""
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The server's command line."""
        args = {**self.args, "host": self.host, "port": self.port}
        return command_line(str(self.binary), args) + list(self.extra_args)

    def environment(self, base: Mapping[str, str] = os.environ) -> dict[str, str]:
        """The server's environment: `base` without an inherited OpenMP thread cap, plus `extra_env`."""
        env = {k: v for k, v in base.items() if k not in ("OMP_NUM_THREADS", "LLAMA_ARG_THREADS")}
        env.update(self.extra_env)
        return env


class LlamaCppServer(ChildServer):
    """One running llama-server: `start()`, `wait_ready()`, `stop()` (or a context manager)."""

    launch: LlamaCppLaunch
    launch_error = LlamaCppLaunchError

    def wait_healthy(self, timeout_s: float = 300.0) -> None:
        """Block until GET /health answers 200; LlamaCppLaunchError (with the log) if it exits or times out."""
        if self.process is None or self.started_at is None:
            raise LlamaCppLaunchError("start() the server before waiting for it")
        deadline = self.started_at + timeout_s
        while True:
            if self.process.poll() is not None:
                raise self._failure(f"llama-server exited with status {self.process.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise self._failure(f"llama-server was not healthy after {timeout_s:.0f} s")
            try:
                if httpx.get(self.launch.base_url + "/health", timeout=5.0).status_code == 200:
                    return
            except httpx.TransportError:  # not listening yet
                pass
            time.sleep(0.25)

    def wait_ready(
        self, prompt: str = "1+1=", max_tokens: int = 1, expect: str | None = None, timeout_s: float = 300.0
    ) -> str:
        """/health, then a greedy completion of `prompt` (equal to `expect` when given); returns its text."""
        self.wait_healthy(timeout_s)
        assert self.started_at is not None
        body = {"model": self.launch.served_model_name, "prompt": prompt, "max_tokens": max_tokens, **GREEDY}
        remaining = max(5.0, self.started_at + timeout_s - time.monotonic())
        try:
            resp = httpx.post(self.launch.base_url + "/v1/completions", json=body, timeout=remaining)
        except httpx.TransportError as exc:
            raise self._failure(f"the readiness completion failed ({type(exc).__name__})") from None
        if resp.status_code != 200:
            raise self._failure(f"readiness completion answered {resp.status_code}: {resp.text[:500]}")
        text = str(resp.json()["choices"][0]["text"])
        if expect is not None and text != expect:
            raise self._failure(f"readiness prompt {prompt!r} gave {text!r}, expected {expect!r}")
        self.ready_after_s = time.monotonic() - self.started_at
        return text

    def _failure(self, what: str) -> LlamaCppLaunchError:
        """An error naming what went wrong, the log's last lines and its path."""
        time.sleep(0.3)  # let a dying server finish writing
        tail = "\n  ".join(self.log_tail(8))
        return LlamaCppLaunchError(f"{what}\nlast log lines:\n  {tail}\n(full log: {self.log_path})")

    def get(self, path: str) -> Any:
        """GET a JSON route of the server (/props, /slots, ...)."""
        resp = httpx.get(self.launch.base_url + path, timeout=30.0)
        resp.raise_for_status()
        return resp.json()
