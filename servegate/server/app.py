"""The application factory: `create_app(served, engine)` -> a FastAPI app serving the manifest.

Start-up runs in the background so /health answers while the model loads: engine.start(), then the
warm-up; /ready turns 200 only when both passed. Shutdown gives the engine the grace period to finish.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.interface import Engine
from servegate.server.async_results import AsyncResults
from servegate.server.guard import BodyGuard
from servegate.server.openapi import openapi_document
from servegate.server.prometheus_metrics import ServerMetrics
from servegate.server.routes import router
from servegate.server.state import ServerState, error_response, internal_error
from servegate.server.tokenizer_routes import router as tokenizer_router
from servegate.server.warmup import run_warmup

log = logging.getLogger("servegate.server")


def _build_engine(served: ServedModel) -> Engine:
    """The manifest's engine, recording its steps where SERVEGATE_STEP_TRACE asks (`gate profile`'s server)."""
    from servegate.runtime import build  # the reference runtime is imported only when no engine is given
    from servegate.runtime.engine.step_trace import open_step_trace

    return build(served, step_trace=open_step_trace())


async def bring_up(state: ServerState) -> None:
    """Start the engine and run the warm-up; readiness (and its reason when not ready) follows."""
    try:
        await _bring_up(state)
    finally:
        state.starting = False


async def _bring_up(state: ServerState) -> None:
    served = state.served
    try:
        await state.engine.start()
    except Exception as exc:  # a model that cannot load keeps the server alive but not ready, with the reason
        state.not_ready_reason = f"the model failed to load: {type(exc).__name__}: {exc}"
        log.error("%s", state.not_ready_reason)
        return
    if served.runtime.warmup:
        state.not_ready_reason = "starting: running the warm-up"
        problems = await run_warmup(served, state.engine)
        if problems:
            state.not_ready_reason = f"warm-up failed: {problems[0]}" + (
                f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            )
            return
    state.ready = True
    state.not_ready_reason = ""
    log.info("ready: serving %s (fingerprint %s)", served.name, served.fingerprint[:16])


def create_app(
    served: ServedModel, engine: Engine | None = None, *, grace_s: float | None = None, owns_engine: bool = True
) -> FastAPI:
    """A FastAPI app serving `served` on `engine` (built from the manifest when None).

    grace_s is how long shutdown lets in-flight work finish (default: failure_policy.request_timeout_s).
    owns_engine=False: the engine is the caller's (a gate's pool), and the app's shutdown leaves it running.
    """
    engine = engine if engine is not None else _build_engine(served)
    fail = served.failure_policy
    grace = fail.request_timeout_s if grace_s is None else grace_s
    results = AsyncResults(
        served.postprocess.async_result_ttl_s, fail.max_queue, fail.retry_after_s, fail.overload_status
    )
    metrics = ServerMetrics(lambda: state.stats())  # read at scrape time, once `state` exists
    state = ServerState(served=served, engine=engine, metrics=metrics, async_results=results)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        starting = asyncio.create_task(bring_up(state), name="servegate-bring-up")
        try:
            yield
        finally:
            state.draining = True
            starting.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await starting
            await results.close()
            try:
                if owns_engine:
                    await engine.shutdown(grace)
            except Exception as exc:  # shutdown must finish even when the engine misbehaves
                log.error("engine shutdown failed: %s", type(exc).__name__)

    app = FastAPI(
        title=f"servegate: {served.name}",
        version=served.version,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served below, with the real request and response schemas
    )
    app.state.serving = state
    app.include_router(router)
    app.include_router(tokenizer_router)
    app.add_middleware(BodyGuard, state=state)

    document: dict[str, object] = {}

    @app.get("/openapi.json", include_in_schema=False)
    async def _openapi() -> JSONResponse:
        if document:
            return JSONResponse(document)
        tokenizer = engine.tokenizer  # loaded: token ids are bounded by the vocabulary
        vocab = len(tokenizer) if tokenizer is not None else None
        built = openapi_document(app, served, vocab)
        if vocab is not None or not state.starting:
            document.update(built)  # kept once nothing about it can change any more
        return JSONResponse(built)

    @app.exception_handler(ServingError)
    async def _serving_error(request: Request, exc: ServingError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            error = ServingError("not_found", detail=f"no route {request.method} {request.url.path[:100]}")
        else:
            error = ServingError("invalid_request", status=exc.status_code, detail=str(exc.detail))
        response = error_response(error)
        response.headers.update(exc.headers or {})  # 405 names the methods the path takes (Allow)
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(ServingError("invalid_request", detail="the request does not match the API"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error_response(internal_error(exc))

    return app
