"""Launch vLLM's OpenAI-compatible server as a child process, wait until it really generates, stop it.

Used by `runtime.backend: vllm` (runtime/remote/vllm_backend.py) and the engines tests; it depends only on the
standard library, httpx and prometheus_client. Readiness is a real greedy completion, not `/health` (vLLM answers 200
there even when the model cannot run, e.g. a head_dim its CPU attention lacks). The server gets its
own process group, so stopping it also stops the engine-core and worker processes it forks.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from servegate.runtime.remote.server_process import ChildServer

VLLM_PYTHON_ENV = "SERVEGATE_VLLM_PYTHON"
"""Environment variable naming the interpreter that has vLLM installed."""

# An exception line of a traceback ("RuntimeError: Worker failed with error '...'"), after vLLM's log prefix.
_EXCEPTION = re.compile(r"(?:^|\]\s+|\s)((?:[\w.]+\.)?\w*(?:Error|Exception): .+)$")
# "... KV cache size: 699,008 tokens" as vLLM 0.32's CPU worker logs it.
_KV_TOKENS = re.compile(r"KV cache size:\s*([\d,]+)\s*tokens", re.IGNORECASE)


class VllmLaunchError(RuntimeError):
    """vLLM did not become ready: it exited, answered an error, or the readiness wait timed out."""


def find_vllm_python(repo_root: Path, environ: Mapping[str, str] = os.environ) -> Path | None:
    """The interpreter that has vLLM: $SERVEGATE_VLLM_PYTHON, else <repo>/.venvs/vllm/bin/python; None if absent."""
    named = environ.get(VLLM_PYTHON_ENV)
    candidate = Path(named) if named else repo_root / ".venvs" / "vllm" / "bin" / "python"
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


@dataclass(frozen=True)
class VllmLaunch:
    """What to start: interpreter, model folder and the engine arguments servegate sets."""

    python: Path
    """Interpreter with vllm installed (its own venv: vLLM pins its own transformers)."""
    model: Path
    """Model folder (config.json, weights, tokenizer)."""
    served_model_name: str
    """The `model` name clients send and `/v1/models` reports."""
    port: int
    """TCP port on `host`."""
    cache_root: Path
    """VLLM_CACHE_ROOT: vLLM writes compiled kernels and usage stats here, not in the user's home."""
    host: str = "127.0.0.1"
    """Interface to listen on."""
    dtype: str = "float32"
    """--dtype."""
    max_model_len: int = 256
    """--max-model-len: prompt plus output tokens per sequence."""
    seed: int = 0
    """--seed."""
    kv_cache_gib: int | None = 1
    """VLLM_CPU_KVCACHE_SPACE: the CPU KV cache in GiB (None: unset, e.g. when --kv-cache-memory-bytes is given)."""
    cpu_threads_bind: str = "0-1"
    """VLLM_CPU_OMP_THREADS_BIND: its default `auto` reserves a core, which leaves one on a 2-core machine."""
    max_num_seqs: int | None = None
    """--max-num-seqs (vLLM's default when None)."""
    extra_args: tuple[str, ...] = ()
    """Further engine arguments, passed as given."""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Further environment variables for the server."""

    @property
    def base_url(self) -> str:
        """The server's root URL (routes: /v1/..., /health, /version, /metrics, /tokenize)."""
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The server's command line (`python -m`: the `vllm` console script fails for the vllm-cpu package)."""
        cmd = [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model)]
        cmd += ["--served-model-name", self.served_model_name, "--host", self.host, "--port", str(self.port)]
        cmd += ["--dtype", self.dtype, "--max-model-len", str(self.max_model_len), "--seed", str(self.seed)]
        if self.max_num_seqs is not None:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        return cmd + list(self.extra_args)

    def environment(self, base: Mapping[str, str] = os.environ) -> dict[str, str]:
        """The server's environment: `base` with vLLM's CPU settings, offline hub, and no inherited thread cap."""
        env = {k: v for k, v in base.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        if self.kv_cache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
        env.update(
            VLLM_CPU_OMP_THREADS_BIND=self.cpu_threads_bind,
            VLLM_CACHE_ROOT=str(self.cache_root),
            HF_HUB_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env


class VllmServer(ChildServer):
    """One running vLLM server: `start()`, `wait_ready()`, `stop()` (or use it as a context manager)."""

    launch: VllmLaunch
    launch_error = VllmLaunchError
    stop_grace_s = 15.0

    def prepare(self) -> None:
        """vLLM's cache folder (VLLM_CACHE_ROOT), made before it starts."""
        self.launch.cache_root.mkdir(parents=True, exist_ok=True)

    def wait_ready(
        self, prompt: str = "12+34=", max_tokens: int = 8, expect: str | None = None, timeout_s: float = 300.0
    ) -> str:
        """Block until a greedy completion of `prompt` succeeds (and equals `expect` if given); returns its text.

        Raises VllmLaunchError with the engine's reason from the log when the server exits, answers an
        error, or is not ready within timeout_s. A connection refused means "still starting".
        """
        if self.process is None or self.started_at is None:
            raise VllmLaunchError("start() the server before waiting for it")
        deadline = self.started_at + timeout_s
        body = {"model": self.launch.served_model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        while True:
            if self.process.poll() is not None:
                raise self._failure(f"vLLM exited with status {self.process.returncode} before it was ready")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._failure(f"vLLM was not ready after {timeout_s:.0f} s")
            try:
                resp = httpx.post(self.launch.base_url + "/v1/completions", json=body, timeout=max(1.0, remaining))
            except httpx.TransportError:  # not listening yet, or the engine died mid-answer: look again
                time.sleep(1.0)
                continue
            if resp.status_code == 200:
                text = str(resp.json()["choices"][0]["text"])
                if expect is not None and text != expect:
                    raise self._failure(f"readiness prompt {prompt!r} gave {text!r}, expected {expect!r}")
                self.ready_after_s = time.monotonic() - self.started_at
                return text
            if resp.status_code in (404, 503) and "model" not in resp.text.lower():
                time.sleep(1.0)  # routes not mounted yet
                continue
            raise self._failure(f"readiness completion answered {resp.status_code}: {resp.text[:500]}")

    def _failure(self, what: str) -> VllmLaunchError:
        """An error naming what went wrong, the engine's own exceptions, the log's last lines and its path."""
        time.sleep(0.5)  # let a dying engine finish writing its traceback
        errors = self.engine_errors()
        parts = [what]
        if errors:
            parts.append("engine errors:\n  " + "\n  ".join(errors[:5]))
        parts.append("last log lines:\n  " + "\n  ".join(self.log_tail(8)))
        parts.append(f"(full log: {self.log_path})")
        return VllmLaunchError("\n".join(parts))

    def engine_errors(self) -> list[str]:
        """The distinct exception lines of the server log ("RuntimeError: ..."), first seen first."""
        found: dict[str, None] = {}
        for line in self.log_text().splitlines():
            match = _EXCEPTION.search(line)
            if match:
                found.setdefault(match.group(1).strip(), None)
        return list(found)

    def kv_cache_tokens(self) -> int | None:
        """The KV cache size in tokens that vLLM logged at start-up, or None before it did."""
        found = _KV_TOKENS.search(self.log_text())
        return int(found.group(1).replace(",", "")) if found else None

    def cache_config(self) -> dict[str, str]:
        """The labels of `vllm:cache_config_info`: block_size, kv_cache_memory_bytes, kv_cache_size_tokens, ..."""
        samples = self.metrics().get("vllm:cache_config_info") or [({}, 0.0)]
        return samples[0][0]
