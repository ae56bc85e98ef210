"""The base of every manifest section."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every manifest section: unknown keys fail, values are immutable once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def check_json_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """Raise ValueError when `schema` is not a valid JSON Schema (draft 2020-12)."""
    if schema is None:
        return None
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"not a valid JSON Schema: {exc.message}") from None
    return schema
