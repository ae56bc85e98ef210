"""The manifest's `postprocess.tools` section: which tool-calling modes a deployment serves, and how a tool call
is read out of the model's text (a declared parser)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from servegate.contracts.section_base import Section

ToolMode = Literal["none", "auto", "required", "named"]
"""A request's `tool_choice`: `none` (answer in text), `auto` (the model decides; its calls are parsed out of the
text), `required` (at least one call, decoded under the grammar engine) or `named` (one call of the named
function, decoded under the grammar engine)."""

TOOL_MODES: tuple[ToolMode, ...] = ("none", "auto", "required", "named")

ToolParser = Literal["hermes"]
"""How calls are written in the text: `hermes`, one JSON object {"name", "arguments"} inside each
<tool_call>...</tool_call> pair (Hermes, Qwen and most open chat models' templates)."""


class ToolCalling(Section):
    """Function calling: requests' `tools` and `tool_choice`, rendered through the chat template (which must write
    the tools into the prompt), and calls read back into `message.tool_calls`. Absent: those fields are refused
    (unsupported_parameter). `required` and `named` are decoded under the grammar engine, so they need
    postprocess.structured_output; a malformed call under `auto` gets failure_policy.on_invalid_output."""

    parser: ToolParser = "hermes"
    """How a tool call is read from the output text under `auto` (see ToolParser)."""
    tool_choice: list[ToolMode] = Field(default_factory=lambda: list(TOOL_MODES), min_length=1)
    """The tool_choice modes requests may ask for; any other is refused with unsupported_parameter."""
    max_tools: int = Field(default=64, ge=1, le=1024)
    """Most functions one request's `tools` may list."""
    max_spec_bytes: int = Field(default=65_536, ge=64, le=16_777_216)
    """Largest `tools` list accepted, in UTF-8 bytes of its compact JSON (it is rendered into every prompt)."""
