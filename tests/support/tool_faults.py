"""A planted tool-call fault: a reading that drops each call's last argument (the safe twin is the real one)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from servegate.runtime.tool_calls import ToolCall, ToolReading


def drops_last_argument(real: Callable[[Any, str], ToolReading]) -> Callable[[Any, str], ToolReading]:
    """`real` (read_tool_calls) with the last argument of every call it reads dropped."""

    def lossy(use: Any, text: str) -> ToolReading:
        reading = real(use, text)
        calls = []
        for call in reading.calls:
            arguments = json.loads(call.arguments)
            arguments.pop(list(arguments)[-1], None)
            calls.append(ToolCall(call.name, json.dumps(arguments)))
        return ToolReading(reading.content, tuple(calls), reading.problem)

    return lossy
