"""The tool-calling fields of a chat request (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`), the
message fields that carry calls and their results, and what they ask of the output.

Semantics follow vLLM: `tools` without `tool_choice` means `auto`; the tools are rendered into the prompt by the
chat template under every mode, `none` included; `required` decodes a JSON list of {"name", "parameters"} and
a named choice decodes the function's arguments, both under the grammar engine (so they always parse).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from servegate.contracts.constraint_fields import OutputConstraint
from servegate.contracts.errors import ServingError
from servegate.contracts.request_fields import KEEP_EXTRAS, Text
from servegate.contracts.section_base import check_json_schema
from servegate.contracts.tools_section import ToolCalling, ToolMode

TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
"""A function name as OpenAI allows it: letters, digits, underscores, dots and dashes, at most 64."""
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
"""The arguments of a function that declares no parameters: an object (as vLLM decodes it)."""


class FunctionDefinition(BaseModel):
    """One function a request offers the model."""

    model_config = KEEP_EXTRAS

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    """The name the model calls it by (unique within `tools`)."""
    description: Text | None = None
    """What it does (rendered into the prompt by the chat template)."""
    parameters: dict[str, Any] | None = None
    """JSON Schema of its arguments object (absent: an object of any properties)."""
    strict: bool | None = None
    """OpenAI's strict mode; forced calls are always decoded under the schema, so it changes nothing."""


class ToolDefinition(BaseModel):
    """One entry of `tools`."""

    model_config = KEEP_EXTRAS

    type: Literal["function"]
    """Only functions are tools."""
    function: FunctionDefinition
    """The function."""


class FunctionName(BaseModel):
    """The function a named tool_choice forces."""

    model_config = KEEP_EXTRAS

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    """Its name (one of `tools`)."""


class NamedToolChoice(BaseModel):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`: exactly one call of that function."""

    model_config = KEEP_EXTRAS

    type: Literal["function"]
    """Always `function`."""
    function: FunctionName
    """The function to call."""


class CalledFunction(BaseModel):
    """The function of an earlier call, as an assistant message carries it."""

    model_config = KEEP_EXTRAS

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    """The function called."""
    arguments: str = Field(max_length=1_048_576)
    """Its arguments as JSON text (OpenAI's shape)."""


class MessageToolCall(BaseModel):
    """One call in an assistant message of the conversation so far."""

    model_config = KEEP_EXTRAS

    id: str = Field(min_length=1, max_length=256)
    """The call's id (a later `tool` message answers it by tool_call_id)."""
    type: Literal["function"]
    """Always `function`."""
    function: CalledFunction
    """What was called."""


class ToolFields(BaseModel):
    """The request fields of function calling (mixed into the chat request model)."""

    tools: list[ToolDefinition] | None = Field(default=None, max_length=1024)
    """Functions the model may call (needs the manifest's postprocess.tools)."""
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    """`none`, `auto` (the default when tools are given), `required`, or a named function."""
    parallel_tool_calls: bool | None = None
    """false: at most one call under `required` (as vLLM); the other modes are not limited."""

    def tool_mode(self) -> ToolMode:
        """The tool_choice mode the request asks for (`auto` when it gives tools and no choice, as OpenAI)."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        return self.tool_choice

    def named_function(self) -> str | None:
        """The function a named tool_choice forces (None: not named)."""
        return self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None

    def function_parameters(self) -> dict[str, dict[str, Any]]:
        """Each offered function's arguments schema, by name (EMPTY_PARAMETERS where it declares none)."""
        return {t.function.name: t.function.parameters or EMPTY_PARAMETERS for t in self.tools or ()}

    def rendered_tools(self) -> list[dict[str, Any]] | None:
        """`tools` as the chat template takes them (None: no tools)."""
        if not self.tools:
            return None
        return [t.model_dump(mode="json", exclude_none=True) for t in self.tools]


@dataclass(frozen=True)
class ToolUse:
    """What one request's output is read for: tool calls under its tool_choice (`none` has no ToolUse)."""

    mode: Literal["auto", "required", "named"]
    parser: str
    """The manifest's postprocess.tools.parser (how an `auto` output writes its calls)."""
    functions: tuple[tuple[str, str], ...]
    """(name, arguments schema as compact JSON) of every offered function, in the request's order."""
    named: str | None = None
    """The function a named choice forces."""

    def parameters(self, name: str) -> dict[str, Any] | None:
        """The arguments schema of function `name` (None: not offered)."""
        found = dict(self.functions).get(name)
        return None if found is None else json.loads(found)


def tool_use(section: ToolCalling | None, fields: ToolFields) -> ToolUse | None:
    """The ToolUse of a request the field checks passed (None: no tools, or tool_choice none)."""
    mode = fields.tool_mode()
    if section is None or mode == "none" or not fields.tools:
        return None
    functions = tuple((name, _compact(schema)) for name, schema in fields.function_parameters().items())
    return ToolUse(mode, section.parser, functions, fields.named_function())


def tool_constraint(fields: ToolFields, compact: bool) -> OutputConstraint | None:
    """The constraint a forced choice is decoded under, as vLLM builds it: `required`, a non-empty JSON list of
    {"name", "parameters"} (at most one with parallel_tool_calls false); named, the function's arguments."""
    mode = fields.tool_mode()
    params = fields.function_parameters()
    if mode == "named":
        name = fields.named_function()
        assert name is not None
        return OutputConstraint("json_schema", _compact(params[name]), "tool_choice", compact)
    if mode != "required":
        return None
    schema: dict[str, Any] = {"type": "array", "minItems": 1}
    defs: dict[str, Any] = {}
    options = []
    for name, given in params.items():
        own = copy.deepcopy(given)
        for key, value in (own.pop("$defs", None) or {}).items():  # refs point at the top: hoist them there
            if key in defs and defs[key] != value:
                raise ServingError("invalid_request", param="tools", detail=f"tools: two schemas named $defs.{key}")
            defs[key] = value
        name_schema = {"type": "string", "enum": [name]}
        options.append({"properties": {"name": name_schema, "parameters": own}, "required": ["name", "parameters"]})
    schema["items"] = {"type": "object", "anyOf": options}
    if fields.parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return OutputConstraint("json_schema", _compact(schema), "tool_choice", compact)


def check_tools(section: ToolCalling | None, fields: ToolFields, messages: list[Any]) -> None:
    """The manifest's limits on a request's tool fields (ServingError, 400): tools declared, the mode served,
    a forced choice with tools to call, the named function among them, names unique, each parameters a JSON
    Schema, and the list within max_tools and max_spec_bytes."""
    mode = fields.tool_mode()
    uses = bool(fields.tools) or mode != "none"
    carried = [i for i, m in enumerate(messages) if m.role == "tool" or m.tool_calls]
    if section is None:
        if uses or carried:
            first = f"messages[{carried[0]}]" if carried else ""
            field = f"{first}.tool_calls" if carried and messages[carried[0]].tool_calls else f"{first}.role"
            param = "tools" if fields.tools else ("tool_choice" if mode != "none" else field)
            raise ServingError(
                "unsupported_parameter", param=param, detail="this deployment declares no postprocess.tools"
            )
        return
    if mode not in section.tool_choice:
        served = ", ".join(section.tool_choice)
        detail = f"tool_choice {mode} is not served (only {served})"
        raise ServingError("unsupported_parameter", param="tool_choice", detail=detail)
    tools = fields.tools or []
    if mode in ("required", "named") and not tools:
        raise ServingError("invalid_request", param="tools", detail=f"tool_choice {mode} needs tools to call")
    if len(tools) > section.max_tools:
        detail = f"tools: at most {section.max_tools} functions (got {len(tools)})"
        raise ServingError("invalid_request", param="tools", detail=detail)
    size = len(_compact([t.model_dump(mode="json", exclude_none=True) for t in tools]).encode())
    if size > section.max_spec_bytes:
        detail = f"tools: {size} bytes as JSON; at most {section.max_spec_bytes} (postprocess.tools.max_spec_bytes)"
        raise ServingError("invalid_request", param="tools", detail=detail)
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool.function.name
        if name in seen:
            raise ServingError("invalid_request", param=f"tools[{i}].function.name", detail=f"two tools named {name}")
        seen.add(name)
        try:
            check_json_schema(tool.function.parameters)
        except ValueError as exc:
            raise ServingError("invalid_request", param=f"tools[{i}].function.parameters", detail=str(exc)) from None
    named = fields.named_function()
    if named is not None and named not in seen:
        detail = f"tool_choice names {named}, which is not in tools"
        raise ServingError("invalid_request", param="tool_choice.function.name", detail=detail)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
