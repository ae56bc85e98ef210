"""What a request becomes before the model sees it: chat template, tokens, limits and truncation.

    prompt            -> tokens (the tokenizer adds BOS only if it does so by itself)
    messages          -> chat template (`tokenizer`, `none`, or a Jinja file) -> tokens
    prompt_token_ids  -> as they are (checked against the vocabulary before: contract_layer.admit)

Then `max_input_tokens`: `reject` answers input_too_long; `left`, `right` and `middle` drop tokens and
say how many (EncodedPrompt.truncated_tokens, reported in the response's usage), never silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servegate.contracts.errors import ServegateError, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.types import GenerationRequest, PromptOptions


@dataclass(frozen=True)
class EncodedPrompt:
    """A request's prompt as model input."""

    token_ids: list[int]
    truncated_tokens: int
    """Prompt tokens dropped by the truncation policy (0 when the prompt fit)."""


def truncate(token_ids: list[int], limit: int, side: str, keep_head: int = 0) -> tuple[list[int], int]:
    """Drop tokens from `side` (left, right or middle) down to `limit`; the first `keep_head` always stay.

    Returns (kept ids, number dropped).
    """
    dropped = len(token_ids) - limit
    if dropped <= 0:
        return token_ids, 0
    head, body = token_ids[:keep_head], token_ids[keep_head:]
    room = limit - len(head)
    if side == "left":
        kept = body[len(body) - room :] if room > 0 else []
    elif side == "right":
        kept = body[:room]
    elif side == "middle":
        front = (room + 1) // 2
        kept = body[:front] + (body[len(body) - (room - front) :] if room - front > 0 else [])
    else:
        raise ValueError(f"unknown truncation side {side!r}")
    return head + kept, dropped


class Preprocessor:
    """Encodes requests for one served model (its tokenizer, chat template and input limits)."""

    def __init__(self, served: ServedModel, tokenizer: Any) -> None:
        self.served = served
        self.tokenizer = tokenizer
        pre = served.preprocess
        self.limit = pre.max_input_tokens
        self.truncation = pre.truncation
        self.template_source: str | None = None
        """Jinja text of a template file (chat_template: PATH)."""
        if pre.chat_template not in ("tokenizer", "none"):
            path = served.resolve_path(pre.chat_template)
            try:
                self.template_source = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ServegateError(f"preprocess.chat_template: cannot read {path}: {exc.strerror}") from None
        self.vocab_size = len(tokenizer)
        """Token ids are 0 to vocab_size - 1."""
        self.check_renders_tools()

    def encode(self, request: GenerationRequest) -> EncodedPrompt:
        """Token ids for the request (truncated as the manifest says), or a ServingError for the client."""
        given = [name for name in ("prompt", "messages", "prompt_token_ids") if getattr(request, name) is not None]
        if len(given) != 1:
            raise ServingError(
                "invalid_request", param="prompt", detail="give exactly one of prompt, messages or prompt_token_ids"
            )
        param = "messages" if request.messages is not None else "prompt"
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
        elif request.messages is not None:
            ids = self._encode_text(self.render_chat(request.messages, request.tools, request.prompt_options))
        else:
            assert request.prompt is not None
            ids = self._encode_text(request.prompt)
        ids, asked_off = self._request_truncation(ids, request.prompt_options)
        if len(ids) > self.limit and self.truncation == "reject":
            raise ServingError("input_too_long", param=param, tokens=len(ids), limit=self.limit)
        kept, dropped = truncate(ids, self.limit, self.truncation, keep_head=self._bos_head(ids))
        return EncodedPrompt(kept, dropped + asked_off)

    def _request_truncation(self, ids: list[int], options: PromptOptions) -> tuple[list[int], int]:
        """The request's own truncate_prompt_tokens, as vLLM applies it: `left` keeps the last tokens, `right` the
        first, and without a side `left` (vLLM 0.32 loads a generative model's tokenizer with truncation_side
        left). Returns (kept, dropped)."""
        limit = options.truncate_prompt_tokens
        if limit is None or len(ids) <= limit:
            return ids, 0
        side = options.truncation_side or "left"
        kept = ids[len(ids) - limit :] if side == "left" else ids[:limit]
        return kept, len(ids) - limit

    # --- pieces ---------------------------------------------------------------------------------

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: PromptOptions | None = None,
    ) -> str:
        """The chat text of `messages` (and the `tools` they may call) under the manifest's chat template, or the
        request's own, rendered as its options say."""
        options = options or PromptOptions()
        turns = [_checked_message(i, m) for i, m in enumerate(messages)]
        if not turns:
            raise ServingError("invalid_request", param="messages", detail="messages is empty")
        if self.served.preprocess.chat_template == "none":
            return "\n".join(f"{turn['role']}: {turn['content']}" for turn in turns)
        template = options.chat_template or self.template_source
        if template is None and getattr(self.tokenizer, "chat_template", None) is None:
            raise ServingError(
                "invalid_request",
                param="messages",
                detail="this model's tokenizer has no chat template: send a prompt instead",
            )
        try:
            text = self.tokenizer.apply_chat_template(
                turns,
                tools=tools,
                chat_template=template,
                tokenize=False,
                add_generation_prompt=options.add_generation_prompt,
                continue_final_message=options.continue_final_message,
                **dict(options.template_kwargs),
            )
        except Exception as exc:  # a template that raises on these messages (e.g. roles it forbids)
            raise ServingError("invalid_request", param="messages", detail=f"chat template: {exc}") from None
        return str(text)

    def check_renders_tools(self) -> None:
        """Raise ServegateError when postprocess.tools is declared and the chat template leaves the tools out of
        the prompt (the model could never see what it may call)."""
        if self.served.postprocess.tools is None:
            return
        probe = {"type": "function", "function": {"name": "servegate_probe_tool", "parameters": {"type": "object"}}}
        try:
            text = self.render_chat([{"role": "user", "content": "hi"}], [probe])
        except ServingError as exc:
            raise ServegateError(f"postprocess.tools: the chat template cannot render tools: {exc.message}") from None
        if "servegate_probe_tool" not in text:
            raise ServegateError(
                "postprocess.tools: the chat template does not write the tools into the prompt, so the model never "
                "sees them: set preprocess.chat_template to a template file that renders `tools`"
            )

    def _encode_text(self, text: str) -> list[int]:
        """Tokens of `text`; no second BOS when a chat template already wrote one."""
        bos = getattr(self.tokenizer, "bos_token", None)
        add_special = not (bos and text.startswith(bos))
        return list(self.tokenizer(text, add_special_tokens=add_special)["input_ids"])

    def _bos_head(self, ids: list[int]) -> int:
        """1 when the prompt starts with the tokenizer's BOS (truncation keeps it), else 0."""
        bos_id = getattr(self.tokenizer, "bos_token_id", None)
        return 1 if bos_id is not None and ids and ids[0] == bos_id and self.limit > 1 else 0


def _checked_message(index: int, message: Any) -> dict[str, Any]:
    """One chat message as the template takes it: OpenAI content parts of type text are joined; an earlier
    call's tool_calls and a tool result's tool_call_id are kept (a participant's name is not rendered)."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ServingError("invalid_request", param=f"messages[{index}]", detail="each message needs a string role")
    content = message.get("content")
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) != len(content) or not all(isinstance(p, str) for p in parts):
            raise ServingError(
                "invalid_request", param=f"messages[{index}].content", detail="only text content parts are supported"
            )
        content = "".join(parts)  # type: ignore[arg-type]  # the check above found every part a str
    if not isinstance(content, str):
        raise ServingError(
            "invalid_request", param=f"messages[{index}].content", detail="content must be a string or text parts"
        )
    kept = {key: message[key] for key in ("tool_calls", "tool_call_id") if message.get(key) is not None}
    return {"role": message["role"], "content": content, **kept}
