"""Field-by-field agreement of two JSON values, shared by the extraction and tool-calling metrics.

A value is flattened to its leaves, each named by its path (`/address/city`, `/items/0`); two values agree on a
leaf when both hold it with the same JSON value (`1` and `1.0` agree, `1` and `"1"` do not, as JSON Schema
compares them). The score is the share of leaves either side holds on which they agree, so a missing field and
an invented one both cost.
"""

from __future__ import annotations

import json
from typing import Any


def leaves(value: Any, path: str = "") -> dict[str, Any]:
    """Every scalar of a JSON value by its path (an empty object or list is a leaf of its own)."""
    if isinstance(value, dict) and value:
        return {k: v for key, item in value.items() for k, v in leaves(item, f"{path}/{key}").items()}
    if isinstance(value, list) and value:
        return {k: v for i, item in enumerate(value) for k, v in leaves(item, f"{path}/{i}").items()}
    return {path: value}


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: numbers by value, true/false only to themselves, the rest by type and value."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def agreement(predicted: Any, expected: Any) -> float:
    """Share of the leaves either value holds on which both agree (1.0: equal values)."""
    ours, theirs = leaves(predicted), leaves(expected)
    union = ours.keys() | theirs.keys()
    matched = sum(1 for k in union if k in ours and k in theirs and _same(ours[k], theirs[k]))
    return matched / len(union) if union else 1.0


def parsed(text: str) -> tuple[bool, Any]:
    """(whether `text` is JSON, its value)."""
    try:
        return True, json.loads(text)
    except (TypeError, ValueError):
        return False, None


def as_calls(value: Any) -> list[dict[str, Any]]:
    """Tool calls as a list of {"name", "arguments"} (one call given as an object is a list of one; anything
    else is no calls)."""
    listed = value if isinstance(value, list) else [value] if isinstance(value, dict) else []
    return [c for c in listed if isinstance(c, dict) and isinstance(c.get("name"), str)]


def name_match(predicted: Any, expected: Any) -> float:
    """1.0 when the calls name the expected functions, in order, and no others; else 0.0."""
    return float([c["name"] for c in as_calls(predicted)] == [c["name"] for c in as_calls(expected)])


def arguments_match(predicted: Any, expected: Any) -> float:
    """Mean over the expected calls of the arguments' agreement with the call at the same place (0 where that
    call names another function or is missing); an extra call counts as one more expected call with none right."""
    ours, theirs = as_calls(predicted), as_calls(expected)
    if not theirs and not ours:
        return 1.0
    scores = []
    for i in range(max(len(ours), len(theirs))):
        if i >= len(ours) or i >= len(theirs) or ours[i]["name"] != theirs[i]["name"]:
            scores.append(0.0)
            continue
        scores.append(agreement(ours[i].get("arguments", {}), theirs[i].get("arguments", {})))
    return sum(scores) / len(scores)
