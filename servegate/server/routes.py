"""The HTTP endpoints: /v1/completions, /v1/chat/completions, /v1/embeddings, /v1/models, async polling,
/health, /ready and /metrics. Each API request goes decode -> parse -> tenant -> engine -> body."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from servegate.contracts.errors import ServingError
from servegate.contracts.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    Endpoint,
    decode_body,
    parse_request,
)
from servegate.contracts.responses import AsyncStatus, ModelCard, ModelList
from servegate.runtime.engine.interface import vocab_size
from servegate.runtime.request_translator import engine_requests
from servegate.server.bodies import BodyBuilder, embeddings_body
from servegate.server.echo import check_echo, echo_completion
from servegate.server.generation import EngineRun, complete
from servegate.server.prompt_logprobs import check_prompt_logprobs, with_prompt_logprobs
from servegate.server.state import ServerState, error_response, internal_error, normalize
from servegate.server.streaming import stream_response

router = APIRouter()
_TASK_OF: dict[str, str] = {"completions": "generate", "chat": "generate", "embeddings": "embed"}
_ID_PREFIX: dict[str, str] = {"completions": "cmpl", "chat": "chatcmpl", "embeddings": "embd"}


def _state(request: Request) -> ServerState:
    return request.app.state.serving


def tenant_of(state: ServerState, request: Request, user: str | None) -> str | None:
    """The request's tenant as preprocess.tenant_from declares (required when declared; never logged)."""
    source = state.served.preprocess.tenant_from
    if source == "none":
        return None
    if source == "header":
        value, param = request.headers.get("x-tenant"), "X-Tenant"
    else:
        value, param = user, "user"
    if not value:
        where = "an X-Tenant header" if source == "header" else "the 'user' field"
        raise ServingError("invalid_request", param=param, detail=f"this deployment needs {where} naming the tenant")
    if len(value) > 256 or not value.isprintable():
        raise ServingError("invalid_request", param=param, detail=f"{param}: at most 256 printable characters")
    return value


async def _parse(request: Request, endpoint: Endpoint) -> tuple[ServerState, Any, str | None]:
    state = _state(request)  # the body guard answered 503 while the server is not ready or drains
    task = state.served.preprocess.task
    if _TASK_OF[endpoint] != task:  # the endpoint itself is wrong, whatever the body says
        use = "/v1/embeddings" if task == "embed" else "/v1/completions or /v1/chat/completions"
        raise ServingError(
            "invalid_request", param="model", detail=f"model '{state.served.name}' serves task {task}: use {use}"
        )
    # token ids are checked against the loaded vocabulary here, before anything is queued (an async request too)
    parsed = parse_request(state.served, endpoint, decode_body(await request.body()), vocab_size(state.engine))
    return state, parsed, tenant_of(state, request, parsed.user)


def _wants_async(request: Request) -> bool:
    prefer = request.headers.get("prefer", "")
    return any(part.strip().lower() == "respond-async" for part in prefer.split(","))


def _accepted(state: ServerState, endpoint: Endpoint, job_id: str) -> JSONResponse:
    body = AsyncStatus(id=job_id, status="queued", endpoint=endpoint).model_dump(mode="json")
    retry = str(max(1, state.served.failure_policy.retry_after_s))
    headers = {"Location": f"/v1/requests/{job_id}", "Retry-After": retry, "Preference-Applied": "respond-async"}
    return JSONResponse(body, status_code=202, headers=headers)


def _ignored_header(parsed: Any) -> dict[str, str]:
    """X-Servegate-Ignored-Fields: the fields `unknown_fields: ignore` dropped (never silently)."""
    dropped = parsed.dropped_fields()
    # Field names are client text: JSON-escaped to printable ASCII, so no name can break or inject a header.
    shown = ", ".join(json.dumps(path)[1:-1] for path in dropped)
    return {"X-Servegate-Ignored-Fields": shown[:1024]} if dropped else {}


async def _generate(request: Request, endpoint: Endpoint) -> Response:
    state, parsed, tenant = await _parse(request, endpoint)
    assert isinstance(parsed, CompletionRequest | ChatCompletionRequest)
    chat = endpoint == "chat"
    request_id = state.new_request_id(_ID_PREFIX[endpoint])
    generations = engine_requests(state.served, parsed, request_id, tenant, arrival_time=time.monotonic())
    tools = generations[0].params.tool_use if generations else None
    builder = BodyBuilder(
        request_id, state.served.name, state.served.fingerprint, parsed.n, tools, token_ids=parsed.return_token_ids
    )
    ignored = _ignored_header(parsed)
    if parsed.prompt_logprobs is not None:
        check_prompt_logprobs(state)
    if isinstance(parsed, CompletionRequest) and parsed.echo:  # the prompt scored (lm-eval's log-likelihoods)
        check_echo(state, parsed, parsed.stream, _wants_async(request))
        status, body, headers = await echo_completion(state, parsed, generations, builder)
        return JSONResponse(body, status_code=status, headers={**headers, **ignored})

    async def answer() -> tuple[int, dict[str, Any], dict[str, str]]:
        done = await complete(state, endpoint, chat, generations, builder)
        return await with_prompt_logprobs(state, parsed, generations, done)

    if _wants_async(request):
        if parsed.stream:
            raise ServingError(
                "invalid_request", param="stream", detail="stream: true cannot be combined with Prefer: respond-async"
            )
        state.async_results.submit(request_id, endpoint, tenant, answer)
        accepted = _accepted(state, endpoint, request_id)
        accepted.headers.update(ignored)
        return accepted
    if parsed.stream:
        include_usage = parsed.stream_options is not None and parsed.stream_options.include_usage
        runs = [EngineRun(state, generation) for generation in generations]
        streamed = await stream_response(state, runs, builder, endpoint, chat, include_usage)
        streamed.headers.update(ignored)
        return streamed
    status, body, headers = await answer()
    return JSONResponse(body, status_code=status, headers={**headers, **ignored})


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    """Text completion (OpenAI /v1/completions), synchronous, streamed or asynchronous."""
    return await _generate(request, "completions")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    """Chat completion (OpenAI /v1/chat/completions), synchronous, streamed or asynchronous."""
    return await _generate(request, "chat")


async def _embed(state: ServerState, parsed: EmbeddingRequest, tenant: str | None) -> tuple[int, dict[str, Any]]:
    texts = parsed.texts()
    timeout = state.served.failure_policy.request_timeout_s
    try:
        vectors = await asyncio.wait_for(state.engine.embed(texts, tenant=tenant), timeout)
    except asyncio.TimeoutError:  # an alias of TimeoutError from Python 3.11 on
        raise ServingError("deadline_exceeded", timeout_s=timeout) from None
    except ServingError as error:
        raise normalize(error, state.served) from None
    except Exception as exc:
        raise internal_error(exc) from None
    return 200, embeddings_body(state.served.name, vectors, parsed.encoding_format, _prompt_tokens(state, texts))


def _prompt_tokens(state: ServerState, texts: list[str]) -> int:
    """Input tokens of an embeddings request, as the engine counts them (0 when it has no tokenizer to ask)."""
    try:
        return sum(state.engine.count_tokens(text) or 0 for text in texts)
    except Exception:  # counting is reporting only; it must not fail a request that already succeeded
        return 0


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    """Embedding vectors (OpenAI /v1/embeddings), for manifests with task: embed."""
    state, parsed, tenant = await _parse(request, "embeddings")
    assert isinstance(parsed, EmbeddingRequest)
    request_id = state.new_request_id("embd")
    if _wants_async(request):

        async def run() -> tuple[int, dict[str, Any], dict[str, str]]:
            try:
                status, body = await _embed(state, parsed, tenant)
            except ServingError as error:
                return error.status, error.to_body(), error.headers()
            return status, body, {}

        state.async_results.submit(request_id, "embeddings", tenant, run)
        return _accepted(state, "embeddings", request_id)
    status, body = await _embed(state, parsed, tenant)
    return JSONResponse(body, status_code=status, headers={"X-Request-Id": request_id})


@router.get("/v1/requests/{request_id}")
async def poll(request: Request, request_id: str) -> Response:
    """The result of an asynchronous request: 202 while running, then its response; 404 once expired."""
    state = _state(request)
    # Polling has no body: the tenant comes in X-Tenant whichever way the request named it (never in the
    # query string, which access logs record).
    tenant = request.headers.get("x-tenant") if state.served.preprocess.tenant_from != "none" else None
    job = state.async_results.get(request_id, tenant)
    if job is None:
        ttl = state.async_results.ttl_s
        detail = f"no request '{request_id[:64]}': unknown, or its result expired ({ttl:g} s after it finished)"
        return error_response(ServingError("not_found", param="id", detail=detail))
    if not job.done:
        body = AsyncStatus(id=job.id, status="in_progress", endpoint=job.endpoint).model_dump(mode="json")
        return JSONResponse(body, status_code=202, headers={"Retry-After": "1"})
    return JSONResponse(job.body, status_code=job.status_code or 500, headers=job.headers)


@router.get("/v1/models")
async def models(request: Request) -> Response:
    """The served model, OpenAI-shaped, with its context length (`max_model_len`, as vLLM reports it)."""
    state = _state(request)
    served = state.served
    card = ModelCard(id=served.name, created=int(state.started_at), max_model_len=served.runtime.max_model_len)
    return JSONResponse(ModelList(data=[card]).model_dump(mode="json"))


@router.get("/version")
async def version(request: Request) -> dict[str, str]:
    """The engine behind this server, as a gateway in front of it reads it (vLLM answers the same route)."""
    from servegate import __version__

    state = _state(request)
    return {"engine": "servegate", "version": __version__, "model": state.served.name}


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "alive"}


@router.get("/ready")
async def ready(request: Request) -> Response:
    """Readiness: model loaded, warm-up passed, not draining (503 with the reason otherwise, and `starting`:
    false when loading or warm-up failed, so a caller waiting for readiness can stop waiting)."""
    state = _state(request)
    refusal = state.unavailable()
    if refusal is None:
        return JSONResponse({"status": "ready", "model": state.served.name, "fingerprint": state.served.fingerprint})
    retry = str(state.served.failure_policy.retry_after_s)
    body = {"status": "not_ready", "reason": refusal.details["detail"], "starting": state.starting}
    return JSONResponse(body, status_code=503, headers={"Retry-After": retry})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics (aggregates only: no request text, no tenant)."""
    state = _state(request)
    state.metrics.ready.set(1 if state.ready and not state.draining else 0)
    return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
