"""`runtime.backend: llamacpp`: servegate starts llama.cpp's `llama-server` on the manifest's GGUF file and stands
in front of it.

The six elements become llama-server arguments through the mapping `gate export --target llamacpp` uses
(runtime/remote/llamacpp_args.py); a field llama.cpp would serve differently than declared is an error naming
it. The binary is `runtime.llamacpp.server`, $SERVEGATE_LLAMACPP_SERVER or `.venvs/llamacpp/bin/llama-server`
(`make llamacpp`). The server logs to a file whose path is printed and is ready when /health says so and
the warm-up prompts give their expected outputs; at start servegate also checks that the GGUF's vocabulary
splits text as the manifest's tokenizer does (servegate sends token ids). Requests go through the same
contract layer as any endpoint (runtime/remote/endpoint.py), respelled for llama-server
(runtime/remote/llamacpp_requests.py). The server is stopped, whole group, on shutdown and when servegate exits.

Tenants: llama.cpp keeps a prompt cache per slot, reused by whichever request the slot serves next. Under
`prefix_caching: false` every request is sent with `cache_prompt: false`, so no request starts from another's
KV: no tenant's prompt can make another's faster. A tenant-scoped prefix cache cannot be kept per tenant
there, so that combination is refused at `gate validate`.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from servegate.contracts.engine_sections import LlamaCppProcess
from servegate.contracts.errors import RemoteUnavailable, ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.contract_layer import AdmittedRequest
from servegate.runtime.remote.completions_stream import completions_body
from servegate.runtime.remote.endpoint import EndpointEngine
from servegate.runtime.remote.endpoint_scoring import cannot_score
from servegate.runtime.remote.gguf_header import GgufHeader, read_gguf_header
from servegate.runtime.remote.identity import RemoteIdentity
from servegate.runtime.remote.llamacpp_args import server_args
from servegate.runtime.remote.llamacpp_process import (
    LLAMACPP_SERVER_ENV,
    MAKE_TARGET,
    LlamaCppLaunch,
    LlamaCppLaunchError,
    LlamaCppServer,
    find_server,
)
from servegate.runtime.remote.llamacpp_requests import llama_body, openai_line, unsupported
from servegate.runtime.remote.server_process import free_port
from servegate.runtime.remote.vllm_args import EngineArgs
from servegate.runtime.types import ErrorEvent, GenerationRequest, ScoreResult

log = logging.getLogger("servegate.runtime")

READY_PROMPT = "1+1="
"""The readiness completion when the manifest declares no warm-up prompts (its output is not checked)."""
VOCABULARY_PROBE = "The quick brown fox: 12+34=46, naïve café!\n  def f(x): return x**2"
"""Text both tokenizers must split alike (letters, digits, accents, code, spaces, a newline)."""


def server_binary(served: ServedModel) -> Path:
    """The llama-server binary, or a ServegateError saying how to get one."""
    settings = served.runtime.llamacpp or LlamaCppProcess()
    roots = [Path.cwd(), Path(__file__).resolve().parents[3]]  # the working directory, then servegate's checkout
    found = find_server(settings.server, roots)
    if found is None:
        where = settings.server or f"${LLAMACPP_SERVER_ENV} or .venvs/llamacpp/bin/llama-server"
        raise ServegateError(
            f"runtime.backend: llamacpp needs the llama-server binary; none at {where}: run `{MAKE_TARGET}`, or set "
            f"runtime.llamacpp.server or ${LLAMACPP_SERVER_ENV}"
        )
    return found


def gguf_of(served: ServedModel) -> tuple[Path, GgufHeader | None]:
    """The GGUF file the manifest serves and its header (None for weights that are not GGUF)."""
    from servegate.runtime.model.checkpoint_scheme import gguf_path
    from servegate.runtime.model.weights import resolve_weights_dir

    directory = resolve_weights_dir(served)
    if served.weights.format != "gguf":
        return directory, None
    path = gguf_path(directory, served.weights.gguf_file)
    return path, read_gguf_header(path)


def llamacpp_arguments(served: ServedModel, model: Path | str, header: GgufHeader | None) -> EngineArgs:
    """The manifest as llama-server arguments; a ServegateError naming every field llama.cpp would serve
    differently (one line each, with the fix)."""
    args = server_args(served, model, header, device=_device(served))
    changes = [r for r in args.residuals if r.status == "behaviour_change"]
    if changes:
        lines = [
            f"runtime.backend: llamacpp cannot serve {r.field} = {json.dumps(r.value)}: {r.reason}" for r in changes
        ]
        raise ServegateError("\n".join(lines))
    return args


def _device(served: ServedModel) -> str:
    """`runtime.device`, with `auto` as cpu: servegate's llama-server build is a CPU build."""
    return served.runtime.device if served.runtime.device != "auto" else "cpu"


class _Reshaped:
    """llama-server's streamed answer with every line in the completions shape (llamacpp_requests.openai_line)."""

    def __init__(self, response: httpx.Response, tokens_as_ids: bool) -> None:
        self.response = response
        self.tokens_as_ids = tokens_as_ids

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The response's lines, rewritten."""
        async for line in self.response.aiter_lines():
            yield openai_line(line, self.tokens_as_ids)

    async def aclose(self) -> None:
        """Close the response."""
        await self.response.aclose()


class LlamaCppEngine(EndpointEngine):
    """llama-server started from the manifest, behind servegate's contract layer (implements the Engine interface)."""

    def __init__(self, served: ServedModel, *, fallback: Any = None, base_url: str | None = None) -> None:
        """`fallback`: the fallback manifest's engine; `base_url`: a llama-server another engine started (then
        this one only talks to it)."""
        settings = served.runtime.llamacpp or LlamaCppProcess()
        self.port = settings.port or free_port(settings.host)
        self.workdir = Path(settings.log_dir) if settings.log_dir else Path.cwd() / ".servegate-cache" / "llamacpp"
        self.server: LlamaCppServer | None = None
        """The running server (None before start, and for an engine over another's server)."""
        self.owns_server = base_url is None
        super().__init__(served, fallback=fallback, base_url=base_url or f"http://{settings.host}:{self.port}/v1")

    def start_sync(self) -> None:
        """Start llama-server, wait for /health and the warm-up outputs, read its identity, check the vocabulary."""
        if self.owns_server and self.server is None:
            self._launch()
        first = self.contract is None
        super().start_sync()
        if first:
            self._identify()

    def _launch(self) -> None:
        served = self.served
        binary = server_binary(served)
        model, header = gguf_of(served)
        args = llamacpp_arguments(served, model, header)
        settings = served.runtime.llamacpp or LlamaCppProcess()
        launch = LlamaCppLaunch(
            binary=binary,
            args=args.args,
            port=self.port,
            host=settings.host,
            extra_args=tuple(settings.extra_args),
            extra_env=dict(settings.env),
        )
        server = LlamaCppServer(launch, self.workdir / f"llamacpp-{served.name}-{self.port}.log")
        log.warning("starting llama-server for %s; its log: %s", served.name, server.log_path)
        server.start()
        atexit.register(server.stop)  # no server left behind when servegate exits without shutting down
        try:
            checks = served.runtime.warmup
            if not checks:
                server.wait_ready(READY_PROMPT, max_tokens=1, timeout_s=settings.startup_timeout_s)
            for check in checks:
                server.wait_ready(check.prompt, check.max_tokens, check.expect, settings.startup_timeout_s)
        except LlamaCppLaunchError as exc:
            server.stop()
            raise RemoteUnavailable(f"llama-server did not become ready for {served.name}: {exc}") from None
        log.warning("llama-server ready after %.1f s on %s", server.ready_after_s or 0.0, launch.base_url)
        self.server = server

    def _identify(self) -> None:
        """Name the engine from /props (llama-server has no /version) and check the vocabulary via /tokenize."""
        root = self.base_url.removesuffix("/v1")
        try:
            props = httpx.get(root + "/props", timeout=10.0).json()
            tokens = httpx.post(root + "/tokenize", json={"content": VOCABULARY_PROBE}, timeout=10.0).json()
        except (httpx.HTTPError, ValueError) as exc:
            raise RemoteUnavailable(f"llama-server at {root} does not answer /props and /tokenize: {exc}") from None
        settings = props.get("default_generation_settings") or {}
        old = self.identity
        self.identity = RemoteIdentity(
            engine="llama.cpp",  # as its `server` header names it (what `gate verify` reads)
            version=str(props.get("build_info") or "") or None,
            models=old.models if old is not None else (),
            max_model_len=int(settings["n_ctx"]) if isinstance(settings.get("n_ctx"), int) else None,
        )
        ours = list(self._tokenizer(VOCABULARY_PROBE, add_special_tokens=False)["input_ids"])
        theirs = [int(t) for t in tokens.get("tokens") or []]
        if ours != theirs:
            at = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
            )
            raise ServegateError(
                f"the GGUF's vocabulary splits text unlike the manifest's tokenizer (first difference at token {at}: "
                f"{ours[at : at + 3]} here, {theirs[at : at + 3]} in llama-server): servegate sends token ids, so they "
                "must agree; serve the tokenizer the GGUF was converted with"
            )

    def _body(self, admitted: AdmittedRequest) -> dict[str, Any]:
        """The completions request llama-server gets (a field it cannot honour is refused here)."""
        params = admitted.request.params
        refusal = unsupported(params)
        if refusal is not None:
            raise refusal
        kv = self.served.runtime.kv_cache
        body = completions_body(self.model, admitted, None, vllm=False)
        caching = kv is not None and kv.prefix_caching
        return llama_body(body, params, prefix_caching=caching, context=self.served.runtime.max_model_len)

    async def _open(self, admitted: AdmittedRequest) -> Any:
        """The streamed answer, its logprobs read in the completions shape."""
        return _Reshaped(await super()._open(admitted), admitted.request.params.tokens_as_ids)

    @property
    def scores_prompts(self) -> bool:
        """llama-server cannot score prompts: its `echo` returns no prompt log-probabilities (0.3.36's build answers
        only the generated token's)."""
        return False

    def score(self, requests: Sequence[GenerationRequest]) -> list[ScoreResult]:
        """An `unsupported_parameter` error for each request (see scores_prompts)."""
        why = "llama-server's echo returns no prompt log-probabilities"
        return [ErrorEvent(r.id, cannot_score(self.base_url, why)) for r in requests]

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Finish requests in flight, then stop llama-server's process group."""
        await super().shutdown(grace_s)
        server, self.server = self.server, None
        if server is not None:
            await asyncio.to_thread(server.stop)

    def memory_bytes(self) -> int | None:
        """Resident memory of the llama-server process now, bytes."""
        return self.server.group_rss_bytes() if self.server is not None else None


def launch_key(served: ServedModel) -> str:
    """What decides the llama-server a manifest needs: two manifests with the same key can share one server."""
    settings = served.runtime.llamacpp or LlamaCppProcess()
    args = server_args(served, served.weights.source + str(served.weights.gguf_file), device=_device(served)).args
    return json.dumps({"args": args, "llamacpp": settings.model_dump(mode="json", exclude={"port"})}, sort_keys=True)


def attach(served: ServedModel, running: LlamaCppEngine, fallback: Any = None) -> LlamaCppEngine:
    """An engine for `served` over a llama-server another engine started (same launch_key)."""
    return LlamaCppEngine(served, fallback=fallback, base_url=running.base_url)
