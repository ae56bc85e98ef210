"""POST /tokenize, POST /detokenize and GET /tokenizer_info as vLLM serves them (servegate.contracts.tokenizer_api).

They answer from the engine's tokenizer and chat template, so the ids are the ones a completion request would
run on: on every backend that loads the manifest's tokenizer, an endpoint's and vLLM's included. An engine
without one (an embedding model's) answers 404 on all three, saying why.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from servegate.contracts.errors import ServingError
from servegate.contracts.field_checks import check_token_ids
from servegate.contracts.field_policy import extra_fields, judge_extras
from servegate.contracts.requests import decode_body, validation_error
from servegate.contracts.tokenizer_api import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizePromptRequest,
    TokenizeResponse,
    tokenizer_info,
)
from servegate.server.state import ServerState

router = APIRouter()


def _preprocessor(request: Request) -> tuple[ServerState, Any, Any]:
    """The server state, the engine's preprocessor (chat template) and its tokenizer; not_found without one."""
    state: ServerState = request.app.state.serving  # readiness: the body guard's (POST), the route's (GET)
    engine = state.engine
    if engine.tokenizer is None or engine.preprocessor is None:
        why = engine.why_no_tokenizer or "it has no prompt encoder"
        detail = f"no route {request.url.path}: this deployment's engine has no tokenizer ({why})"
        raise ServingError("not_found", detail=detail)
    return state, engine.preprocessor, engine.tokenizer


def _parse(state: ServerState, model_cls: type[BaseModel], data: dict[str, Any]) -> Any:
    try:
        parsed = model_cls.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, data) from None
    judge_extras(list(extra_fields(parsed)), "tokenize", state.served.preprocess.unknown_fields, set())
    model = getattr(parsed, "model", None)
    if model is not None and model != state.served.name:
        detail = f"model '{model}' is not served here; available: {state.served.name}"
        raise ServingError("not_found", param="model", detail=detail)
    return parsed


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    """Token ids of a prompt, or of chat messages rendered with the manifest's chat template (as vLLM)."""
    state, preprocessor, tokenizer = _preprocessor(request)
    data = decode_body(await request.body())
    if "messages" in data:
        chat: TokenizeChatRequest = _parse(state, TokenizeChatRequest, data)
        messages = [{"role": m.role, "content": m.text()} for m in chat.messages]
        text, special, strs = preprocessor.render_chat(messages), chat.add_special_tokens, chat.return_token_strs
    else:
        plain: TokenizePromptRequest = _parse(state, TokenizePromptRequest, data)
        text, special, strs = plain.prompt, plain.add_special_tokens, plain.return_token_strs
    ids = [int(t) for t in tokenizer(text, add_special_tokens=special)["input_ids"]]
    body = TokenizeResponse(
        count=len(ids),
        max_model_len=state.served.runtime.max_model_len,
        tokens=ids,
        token_strs=[tokenizer.decode([t]) for t in ids] if strs else None,
    )
    return JSONResponse(body.model_dump(mode="json"))


@router.post("/detokenize")
async def detokenize(request: Request) -> Response:
    """The text of token ids (as vLLM)."""
    state, _, tokenizer = _preprocessor(request)
    parsed: DetokenizeRequest = _parse(state, DetokenizeRequest, decode_body(await request.body()))
    check_token_ids(len(tokenizer), {f"tokens[{i}]": [token] for i, token in enumerate(parsed.tokens)})
    return JSONResponse(DetokenizeResponse(prompt=tokenizer.decode(parsed.tokens)).model_dump())


@router.get("/tokenizer_info")
async def get_tokenizer_info(request: Request) -> Response:
    """The tokenizer's configuration: special tokens, chat template, lengths (as vLLM)."""
    unavailable = request.app.state.serving.unavailable()  # a GET: the body guard does not see it
    if unavailable is not None:
        raise unavailable
    state, preprocessor, tokenizer = _preprocessor(request)
    template = None
    if state.served.preprocess.chat_template != "none":
        template = preprocessor.template_source or getattr(tokenizer, "chat_template", None)
    info = tokenizer_info(tokenizer, state.served.runtime.max_model_len, template)
    return JSONResponse(info)
