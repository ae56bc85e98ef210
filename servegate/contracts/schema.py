"""The manifest's JSON Schema, as exported by `gate schema` (for editors and CI validation)."""

from __future__ import annotations

from typing import Any

from servegate.contracts.manifest import ServedModel

_BYTE_SIZE = {
    "anyOf": [
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*([kKmMgGtT][iI]?)?[bB]?\s*$"},
    ],
    "description": "Bytes, as an integer or with a unit (e.g. 2GiB, 512MB).",
}
_BYTE_FIELDS = {("KVCache", "memory_budget"), ("Targets", "memory"), ("Capacity", "runtime_overhead")}


def manifest_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a manifest file, including the `include:` key files may use."""
    schema = ServedModel.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "servegate ServedModel manifest"
    defs = schema.get("$defs", {})
    for model, field in _BYTE_FIELDS:
        props = defs.get(model, {}).get("properties", {})
        if field in props:
            nullable = any(opt.get("type") == "null" for opt in props[field].get("anyOf", []))
            description = props[field].get("description", _BYTE_SIZE["description"])
            options = [*_BYTE_SIZE["anyOf"], *([{"type": "null"}] if nullable else [])]
            replacement: dict[str, Any] = {"anyOf": options, "description": description}
            if "default" in props[field]:
                replacement["default"] = props[field]["default"]
            props[field] = replacement
    schema["properties"]["include"] = {
        "description": "Base manifest(s) merged under this file (paths relative to it).",
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
    }
    return schema
