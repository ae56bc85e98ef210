"""The served model as a client sees it over HTTP: one code path for servegate's runtime and any endpoint.

The under-load checks (gates/checks/load.py, gates/probes/structured_load.py) send OpenAI completions and read what
comes back, so they measure what a client would, with no internal counter:

- `runtime.backend: reference`: servegate's own app (`servegate.server.create_app`) in process, driven
  through httpx's ASGI transport, as the contract gate drives it;
- an endpoint or a vLLM server servegate started: the remote's `/v1/completions` itself, with the prompt
  as the token ids the manifest's contract makes of it (template, input limit, truncation: `admit`), so
  the remote runs the same input the suites ran, and nothing of servegate stands between.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import httpx

from servegate.contracts.manifest import ServedModel
from servegate.gates.base import GateContext, GateSetupError
from servegate.gates.probes.contract_probes import CHAT, COMPLETIONS, tenant_fields, tenant_headers
from servegate.runtime.types import GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from servegate.runtime.remote.endpoint import EndpointEngine

READY_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 120.0
MAX_CONCURRENCY = 32
"""Most requests kept in flight by a load phase (a check, not a bench)."""


def load_concurrency(served: ServedModel) -> tuple[int, str]:
    """Requests in flight during a load phase (the load gate's, the contract gate's probes under load), and the
    field that says so."""
    workload = served.capacity.workload
    if workload is not None and workload.concurrency is not None:
        declared, source = workload.concurrency, "capacity.workload.concurrency"
    else:
        declared, source = served.batching.max_batch_size, "batching.max_batch_size"
    return max(2, min(declared, MAX_CONCURRENCY)), source


@dataclass(frozen=True)
class Answer:
    """One completion as the client received it (choice 0), streamed or not."""

    stream: bool
    max_tokens: int
    """The max_tokens the client asked for."""
    status: int
    text: str
    chunks: tuple[str, ...] = ()
    """The text of every streamed chunk that carried some, in order (empty for a non-streamed answer)."""
    token_ids: tuple[int, ...] | None = None
    """Token ids as the server sent them (vLLM's and servegate's `return_token_ids`), else None."""
    finish_reasons: tuple[str, ...] = ()
    """Every finish_reason the answer carried: one for a well-formed answer."""
    text_after_finish: bool = False
    """Whether a chunk carried text after the chunk with the finish_reason."""
    completion_tokens: int | None = None
    """`usage.completion_tokens` as reported (None when the answer carried no usage)."""
    error: str | None = None
    """The error code of a refused answer or an error event in the stream."""
    tool_calls: tuple[tuple[str, str], ...] = ()
    """A chat answer's tool calls as (function name, arguments text), streamed deltas folded by index."""
    logprob_tokens: tuple[str, ...] = ()
    """A non-streamed completion's logprobs.tokens, as the server named them."""
    top_logprobs: tuple[dict[str, float], ...] = ()
    """Its logprobs.top_logprobs: each position's alternatives by name."""

    @property
    def ok(self) -> bool:
        """Whether the answer is a completed 200 with no error."""
        return self.status == 200 and self.error is None

    @property
    def bytes(self) -> int:
        """Size of the answer's text in UTF-8 bytes."""
        return len(self.text.encode("utf-8"))


def _error_code(body: str) -> str:
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return "unreadable"
    code = error.get("code") if isinstance(error, dict) else None
    return str(code or "error")


def read_plain(body: dict[str, Any], max_tokens: int) -> Answer:
    """A non-streamed completions body as an Answer."""
    choice = (body.get("choices") or [{}])[0]
    reason = choice.get("finish_reason")
    ids = choice.get("token_ids")
    usage = body.get("usage") or {}
    message = choice.get("message") or {}  # a chat answer
    logprobs = choice.get("logprobs") if isinstance(choice.get("logprobs"), dict) else {}
    calls = [c.get("function") or {} for c in message.get("tool_calls") or []]
    return Answer(
        stream=False,
        max_tokens=max_tokens,
        status=200,
        text=str(choice.get("text") or message.get("content") or ""),
        token_ids=tuple(int(t) for t in ids) if ids is not None else None,
        finish_reasons=(str(reason),) if reason else (),
        completion_tokens=usage.get("completion_tokens"),
        tool_calls=tuple((str(f.get("name")), str(f.get("arguments"))) for f in calls),
        logprob_tokens=tuple(str(t) for t in logprobs.get("tokens") or ()),
        top_logprobs=tuple(dict(t or {}) for t in logprobs.get("top_logprobs") or ()),
    )


def read_sse(body: str, max_tokens: int) -> Answer:
    """A streamed completions body (server-sent events) as an Answer: every chunk of choice 0 folded in."""
    chunks: list[str] = []
    ids: list[int] | None = None
    reasons: list[str] = []
    after = False
    usage: dict[str, Any] = {}
    error = None
    calls: dict[int, tuple[str, str]] = {}
    for line in body.splitlines():
        data = line[5:].strip() if line.startswith("data:") else ""
        if data in ("", "[DONE]"):
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            error = _error_code(data)
            continue
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}  # a chat chunk
            text = choice.get("text") or delta.get("content") or ""
            for call in delta.get("tool_calls") or []:  # OpenAI's deltas: the name once, the arguments in pieces
                function = call.get("function") or {}
                name, arguments = calls.get(int(call.get("index", 0)), ("", ""))
                name += function.get("name") or ""
                calls[int(call.get("index", 0))] = (name, arguments + (function.get("arguments") or ""))
            if text:
                chunks.append(text)
                after = after or bool(reasons)
            if choice.get("token_ids") is not None:
                ids = (ids or []) + [int(t) for t in choice["token_ids"]]
            if choice.get("finish_reason"):
                reasons.append(str(choice["finish_reason"]))
    return Answer(
        stream=True,
        max_tokens=max_tokens,
        status=200,
        text="".join(chunks),
        chunks=tuple(chunks),
        token_ids=tuple(ids) if ids is not None else None,
        finish_reasons=tuple(reasons),
        text_after_finish=after,
        completion_tokens=usage.get("completion_tokens"),
        error=error,
        tool_calls=tuple((calls[i][0], calls[i][1]) for i in sorted(calls)),
    )


def _greedy_fields(max_tokens: int, stream: bool, extra: dict[str, Any] | None) -> dict[str, Any]:
    """The fields every probe completion carries: greedy, its max_tokens, streamed or not (with usage)."""
    common = {"max_tokens": max_tokens, "temperature": 0.0, "stream": stream, **(extra or {})}
    if stream:
        common["stream_options"] = {"include_usage": True}
    return common


def app_completion_body(
    served: ServedModel, prompt: str, max_tokens: int, stream: bool, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The completions body a probe sends servegate's own app for a text prompt (HttpTarget.body): greedy, with the
    manifest's tenant fields, asking for the generated token ids (`return_token_ids`)."""
    fields = {"return_token_ids": True, **_greedy_fields(max_tokens, stream, extra), **tenant_fields(served)}
    return {"model": served.name, "prompt": prompt, **fields}


class HttpTarget:
    """Sends greedy completions to the served model and reads the answers (use `open_target`)."""

    def __init__(self, served: ServedModel, client: httpx.AsyncClient, label: str, remote: Any = None) -> None:
        self.served = served
        self.client = client
        self.label = label
        """Where the answers came from, as reports name it."""
        self._remote = remote
        """The endpoint engine whose remote is addressed directly (None: servegate's app)."""
        self._tokenizer: Any = None

    def body(self, prompt: str, max_tokens: int, stream: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The completions request for a prompt: text to servegate's app, contract-made token ids to a remote;
        `extra`: more fields, the same to either (e.g. `structured_outputs`). servegate's app and vLLM are asked
        for the generated token ids (`return_token_ids`), so tokens are counted, never re-tokenized text."""
        if self._remote is None:
            return app_completion_body(self.served, prompt, max_tokens, stream, extra)
        common = _greedy_fields(max_tokens, stream, extra)
        from servegate.runtime.contract_layer import admit

        request = GenerationRequest(id="load", prompt=prompt, params=SamplingParams(max_tokens=max_tokens))
        admitted = admit(self.served, self._remote.preprocessor, request)
        body: dict[str, Any] = {"model": self._remote.model, "prompt": admitted.token_ids, **common,
                                "seed": admitted.seed}  # fmt: skip
        if admitted.stop:
            body["stop"] = list(admitted.stop)
        identity = self._remote.identity
        if identity is not None and identity.engine == "vllm":
            body["return_token_ids"] = True
        return body

    async def complete(
        self, prompt: str, max_tokens: int, *, stream: bool, extra: dict[str, Any] | None = None
    ) -> Answer:
        """One greedy completion (`extra`: more body fields); a refusal or a broken connection is an Answer with
        its error code."""
        path = "/completions" if self._remote is not None else COMPLETIONS
        headers = tenant_headers(self.served) if self._remote is None else {}
        return await self._post(path, self.body(prompt, max_tokens, stream, extra), max_tokens, stream, headers)

    async def _post(
        self, path: str, body: dict[str, Any], max_tokens: int, stream: bool, headers: dict[str, str]
    ) -> Answer:
        """Send one generation request and read its answer (a refusal or a broken connection: its error code)."""
        try:
            response = await self.client.post(path, json=body, headers=headers)
        except (httpx.HTTPError, OSError) as exc:
            return Answer(stream, max_tokens, 0, "", error=f"unreachable ({type(exc).__name__})")
        if response.status_code != 200:
            return Answer(stream, max_tokens, response.status_code, "", error=_error_code(response.text))
        if stream or response.headers.get("content-type", "").startswith("text/event-stream"):
            return read_sse(response.text, max_tokens) if stream else _as_plain(read_sse(response.text, max_tokens))
        return read_plain(response.json(), max_tokens)

    async def chat(
        self, messages: list[dict[str, Any]], max_tokens: int, *, stream: bool, extra: dict[str, Any] | None = None
    ) -> Answer:
        """One greedy chat completion through servegate's app (`extra`: more body fields, e.g. tools)."""
        if self._remote is not None:
            raise GateSetupError("chat probes go through servegate's server: open the target with front=True")
        body = {"model": self.served.name, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
        body.update({"stream": stream, **(extra or {}), **tenant_fields(self.served)})
        return await self._post(CHAT, body, max_tokens, stream, tenant_headers(self.served))

    def tokens_received(self, answer: Answer) -> int:
        """Output tokens the client got: the ids when the server sent them, else the manifest's tokenizer's count."""
        if answer.token_ids is not None:
            return len(answer.token_ids)
        if not answer.text:
            return 0
        if self._tokenizer is None:
            from servegate.runtime.model.weights import load_tokenizer

            self._tokenizer = load_tokenizer(self.served)
        return len(self._tokenizer(answer.text, add_special_tokens=False)["input_ids"])


def _as_plain(answer: Answer) -> Answer:
    """A server that streams although asked not to: the folded stream, marked as the non-streamed answer."""
    from dataclasses import replace

    return replace(answer, stream=False, chunks=())


@asynccontextmanager
async def open_target(ctx: GateContext, served: ServedModel, front: bool = False) -> AsyncIterator[HttpTarget]:
    """The served model over HTTP: servegate's app in process, or the candidate's remote directly (`front`:
    servegate's app in front of the remote, for what only servegate does, such as reading tool calls)."""
    async with AsyncExitStack() as stack:
        if served.runtime.remote and not front:
            engine = cast("EndpointEngine", ctx.engines.get(served))  # a remote manifest's engine talks to its URL
            await asyncio.to_thread(engine.start_sync)
            client = await stack.enter_async_context(
                httpx.AsyncClient(base_url=engine.base_url, timeout=REQUEST_TIMEOUT_S)
            )
            yield HttpTarget(served, client, f"the remote at {engine.base_url} (directly)", remote=engine)
            return
        try:
            from servegate.server import create_app
        except ImportError as exc:
            raise GateSetupError(f"servegate.server is not available, so nothing can be read over HTTP: {exc}") from exc
        app = create_app(served, ctx.engines.factory(served))
        lifespan = getattr(getattr(app, "router", None), "lifespan_context", None)
        if lifespan is not None:
            await stack.enter_async_context(lifespan(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://servegate.load", timeout=REQUEST_TIMEOUT_S
            )
        )
        await wait_ready(client)
        yield HttpTarget(served, client, "servegate's server (in process)")


async def wait_ready(client: httpx.AsyncClient, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll /ready until the model is loaded and warmed up; a failed start is a setup error."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while True:
        response = await client.get("/ready")
        if response.status_code == 200:
            return
        reason = response.json().get("reason", "") if response.status_code == 503 else str(response.status_code)
        if not reason.startswith("starting"):  # a failed warm-up or load: waiting longer cannot help
            raise GateSetupError(f"the server is not ready: {reason}")
        if loop.time() > end:
            raise GateSetupError(f"the server did not become ready within {timeout_s:.0f} s: {reason}")
        await asyncio.sleep(0.05)
