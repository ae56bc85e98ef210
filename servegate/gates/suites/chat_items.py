"""Items of the chat suite kinds: a `chat` item is a plain chat request, an `extraction` item one decoded under its
JSON Schema, a `tools` item one that offers its tools; all are built by the request translator every API request
goes through, so an item means what the same body sent to `gate serve` means, and a bad item is refused as the API
would refuse it.

Rows carry their schema and tools as JSON text (an object is taken too): datasets reads nested JSON as Arrow
structs, which would fill the keys one row lacks with nulls and so change another row's schema.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from servegate.contracts.errors import ServegateError, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.quality_section import Suite
from servegate.contracts.requests import parse_request
from servegate.runtime.request_translator import engine_requests
from servegate.runtime.tool_calls import read_tool_calls
from servegate.runtime.types import GenerationRequest


def _json_field(row: dict[str, Any], name: str, where: str) -> Any:
    value = row.get(name)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ServegateError(f"{where}: `{name}` is not JSON: {exc}") from None
    return value


def _body(suite: Suite, row: dict[str, Any], prompt: str, schema: Any, where: str) -> dict[str, Any]:
    """The chat body of one item: the prompt as the user's message, greedy, the suite's max_tokens."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}], "max_tokens": suite.max_tokens,
                            "temperature": 0}  # fmt: skip
    if suite.kind == "chat":
        return body
    if suite.kind == "extraction":
        own = _json_field(row, "schema", where)
        chosen = own if own is not None else schema
        if not isinstance(chosen, dict):
            raise ServegateError(
                f"{where}: an extraction item needs a `schema` (a JSON Schema object), or the suite one: "
                "postprocess.output_schema or <suite>.schema.json beside the suite file"
            )
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "item", "schema": chosen,
                                                                          "strict": True}}  # fmt: skip
        return body
    tools = _json_field(row, "tools", where)
    if not isinstance(tools, list) or not tools:
        raise ServegateError(f"{where}: a tools item needs `tools`, a non-empty list of functions (as JSON)")
    body["tools"] = tools
    choice = row.get("tool_choice")
    if choice is not None:
        parsed = _json_field(row, "tool_choice", where) if str(choice).lstrip().startswith("{") else choice
        body["tool_choice"] = parsed
    return body


def item_request(
    served: ServedModel, suite: Suite, row: dict[str, Any], item_id: str, prompt: str, schema: Any
) -> GenerationRequest:
    """The engine request of one chat, extraction or tools item, as `gate serve` would build it from the same body
    (ServegateError naming the item for a body the manifest refuses)."""
    where = f"quality.suites[{suite.name}] item {item_id}"
    body = _body(suite, row, prompt, schema, where)
    try:
        parsed = parse_request(served, "chat", {"model": served.name, **body})
        (request,) = engine_requests(served, parsed, item_id, None)
    except ServingError as error:
        raise ServegateError(f"{where}: the manifest refuses it ({error.param}: {error.message})") from None
    return request


def item_schema(request: GenerationRequest | None) -> dict[str, Any] | None:
    """The JSON Schema an extraction item's answer is decoded under (None: not an extraction item)."""
    constraint = request.params.constraint if request is not None else None
    return constraint.schema() if constraint is not None else None


def called(request: GenerationRequest, text: str, parser: str | None = None) -> str:
    """The calls a tools item's answer makes, as JSON [{"name", "arguments"}] (`[]`: none, or none that parse),
    read by `parser` (None: the one the item was built with)."""
    use = request.params.tool_use
    if use is None:
        return "[]"
    if parser is not None:
        use = replace(use, parser=parser)
    reading = read_tool_calls(use, text)
    calls = []
    for call in reading.calls:
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            arguments = call.arguments
        calls.append({"name": call.name, "arguments": arguments})
    return json.dumps(calls, ensure_ascii=False)
