"""Markdown building blocks of the serving note: table cells, inline code, tables, fences, schema field rows."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from servegate.contracts.units import format_bytes


def cell(value: Any) -> str:
    """A value as one table cell: pipes escaped, line breaks as <br>, None as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value).replace("\\", "\\\\").replace("|", "\\|")
    return re.sub(r"\r?\n", "<br>", text)


def code(value: Any) -> str:
    """Inline code that survives backticks and pipes in the value (pipes escaped for table cells)."""
    text = re.sub(r"\s*\n\s*", " ", str(value))
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}".replace("|", "\\|")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A GitHub-flavoured Markdown table (cells already formatted are kept as they are)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(v if isinstance(v, Raw) else cell(v) for v in row) + " |")
    return lines + [""]


class Raw(str):
    """Cell text that is already Markdown."""


def ms(value: float | None) -> str:
    """Milliseconds with one decimal and thousands separators; an em dash for None."""
    return "—" if value is None else f"{value:,.1f} ms"


def fmt(value: float | None, unit: str) -> str:
    """A figure with its unit (bytes also in binary units, ms with one decimal); an em dash for None."""
    if value is None:
        return "—"
    if unit == "bytes":
        return f"{format_bytes(value)} ({int(value):,} bytes)"
    if unit == "ms":
        return ms(value)
    return f"{value:,.3g} {unit}"


def fence(language: str, text: str) -> list[str]:
    """A fenced code block long enough to hold any backtick run inside `text`."""
    ticks = "`" * max(3, max((len(m) for m in re.findall(r"`{3,}", text)), default=0) + 1)
    return [f"{ticks}{language}", text, ticks, ""]


def details(summary: str, body: list[str]) -> list[str]:
    """A collapsed <details> block (GitHub and the Hub render it; plain Markdown shows it open)."""
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "</details>", ""]


def type_of(spec: dict[str, Any]) -> str:
    """A JSON Schema property's type in words (`string or list of integer`)."""
    if "$ref" in spec:
        return spec["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in spec:
        return " or ".join(type_of(s) for s in spec["anyOf"] if s.get("type") != "null")
    if spec.get("type") == "array":
        return f"list of {type_of(spec.get('items', {}))}"
    return str(spec.get("type", "any"))


def limits_of(spec: dict[str, Any]) -> str:
    """A JSON Schema property's limits in words (`= 1; >= 0; chars <= 256`)."""
    parts = []
    for branch in [spec, *spec.get("anyOf", [])]:
        for key, label in (("const", "="), ("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤")):
            if key in branch:
                parts.append(f"{label} {branch[key]}")
        for key, label in (("minLength", "chars ≥"), ("maxLength", "chars ≤"), ("maxItems", "items ≤")):
            if key in branch:
                parts.append(f"{label} {branch[key]}")
        if "enum" in branch:
            parts.append("one of " + ", ".join(json.dumps(v) for v in branch["enum"]))
    return "; ".join(dict.fromkeys(parts))


def field_rows(schema: dict[str, Any]) -> list[tuple[Any, ...]]:
    """One table row per top-level property of a request schema: field, type, limits, meaning."""
    required = set(schema.get("required", []))
    rows = []
    for name, spec in schema.get("properties", {}).items():
        label = f"{code(name)} (required)" if name in required else code(name)
        meaning = str(spec.get("description", "")).split("\n")[0]
        rows.append((Raw(label), type_of(spec), limits_of(spec) or None, meaning or None))
    return rows
