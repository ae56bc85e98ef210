"""The output-constraint fields of a request, in the five spellings clients send, and the one constraint they name.

- OpenAI: `response_format` `{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"name", "schema",
  "strict"}}` (`{"type": "text"}` asks for nothing);
- vLLM: `structured_outputs` `{"json" | "regex" | "choice" | "grammar" | "json_object"}`, and its older top-level
  `guided_json`, `guided_regex`, `guided_choice` and `guided_grammar`.

A request names at most one constraint. `strict` changes nothing: the mask enforces every schema (as vLLM does).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from servegate.contracts.errors import ServingError
from servegate.contracts.request_fields import KEEP_EXTRAS
from servegate.contracts.section_base import check_json_schema
from servegate.contracts.structured_section import ConstraintKind, StructuredOutput

ANY_JSON_OBJECT = '{"type": "object"}'
"""The schema of `json_object`: any JSON object."""


@dataclass(frozen=True)
class OutputConstraint:
    """The one constraint a request's output must satisfy, as the grammar engine takes it."""

    kind: ConstraintKind
    spec: str
    """The schema as compact JSON text, the regex, the choices as a JSON list, or the grammar text."""
    param: str
    """The request field it came from (named in errors)."""
    compact: bool = False
    """JSON without whitespace between tokens (the manifest's structured_output.whitespace: compact)."""

    def size_bytes(self) -> int:
        """UTF-8 bytes of the spec (what structured_output.max_spec_bytes limits)."""
        return len(self.spec.encode())

    def as_structured_outputs(self) -> dict[str, Any]:
        """The constraint in vLLM's spelling (`structured_outputs`). The whitespace rule is not in it: vLLM sets
        that per server (--structured-outputs-config)."""
        if self.kind == "json_object":
            return {"json_object": True}
        value: Any = json.loads(self.spec) if self.kind in ("json_schema", "choice") else self.spec
        return {"json" if self.kind == "json_schema" else self.kind: value}

    def schema(self) -> dict[str, Any] | None:
        """The JSON Schema the output must satisfy (json_object and json_schema), else None."""
        return json.loads(self.spec) if self.kind in ("json_object", "json_schema") else None


class JsonSchemaFormat(BaseModel):
    """`response_format.json_schema`: the schema the output's JSON must satisfy."""

    model_config = KEEP_EXTRAS

    name: str = Field(min_length=1, max_length=64)
    """The schema's name (OpenAI requires one; it does not change the output)."""
    description: str | None = None
    """What the output is for (it does not change the output)."""
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    """The JSON Schema (absent: any JSON value)."""
    strict: bool | None = None
    """OpenAI's strict mode; the mask enforces every schema, so this changes nothing."""


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`."""

    model_config = KEEP_EXTRAS

    type: Literal["text", "json_object", "json_schema"]
    """`text`: no constraint; `json_object`: any JSON object; `json_schema`: JSON matching json_schema.schema."""
    json_schema: JsonSchemaFormat | None = None
    """The schema, with type json_schema."""


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one of its fields."""

    model_config = KEEP_EXTRAS

    json_spec: dict[str, Any] | str | None = Field(default=None, alias="json")
    """A JSON Schema (an object, or its JSON text)."""
    regex: str | None = None
    """A regular expression the whole output matches."""
    choice: list[str] | None = Field(default=None, min_length=1)
    """The output is exactly one of these strings."""
    grammar: str | None = None
    """A context-free grammar (Lark or GBNF) the output is in."""
    json_object: bool | None = None
    """true: any JSON object."""


class ConstraintFields(BaseModel):
    """The request fields that constrain the output (mixed into the completion and chat request models)."""

    response_format: ResponseFormat | None = None
    """OpenAI: `json_object` or `json_schema` output (needs the manifest's postprocess.structured_output)."""
    structured_outputs: StructuredOutputs | None = None
    """vLLM: a JSON schema, regex, choice list or grammar the output satisfies."""
    guided_json: dict[str, Any] | str | None = None
    """vLLM (older spelling of structured_outputs.json)."""
    guided_regex: str | None = None
    """vLLM (older spelling of structured_outputs.regex)."""
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    """vLLM (older spelling of structured_outputs.choice)."""
    guided_grammar: str | None = None
    """vLLM (older spelling of structured_outputs.grammar)."""

    def output_constraint(self) -> OutputConstraint | None:
        """The one constraint the request names (None: none); ServingError (400) when it names several."""
        found = [c for c in _named(self) if c is not None]
        if len(found) > 1:
            names = ", ".join(c.param for c in found)
            raise ServingError(
                "invalid_request", param=found[1].param, detail=f"give one output constraint, not several ({names})"
            )
        return found[0] if found else None


def _schema_text(schema: dict[str, Any] | str | None, param: str) -> str:
    """A schema as compact JSON text (no schema: any JSON value); ServingError when the text is not JSON."""
    if schema is None:
        return "{}"
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ServingError("invalid_request", param=param, detail=f"{param}: not JSON ({exc.msg})") from None
    return json.dumps(schema, separators=(",", ":"))  # key order kept: properties come out in it


def _named(fields: ConstraintFields) -> list[OutputConstraint | None]:
    """Every constraint the request's fields name, in the order of the fields."""
    found: list[OutputConstraint | None] = []
    rf = fields.response_format
    if rf is not None and rf.type == "json_object":
        found.append(OutputConstraint("json_object", ANY_JSON_OBJECT, "response_format"))
    if rf is not None and rf.type == "json_schema":
        if rf.json_schema is None:
            raise ServingError(
                "invalid_request", param="response_format.json_schema", detail="type json_schema needs json_schema"
            )
        schema = _schema_text(rf.json_schema.json_schema, "response_format.json_schema.schema")
        found.append(OutputConstraint("json_schema", schema, "response_format"))
    so = fields.structured_outputs
    if so is not None:
        if so.json_spec is not None:
            spec = _schema_text(so.json_spec, "structured_outputs.json")
            found.append(OutputConstraint("json_schema", spec, "structured_outputs.json"))
        found.append(_text("regex", so.regex, "structured_outputs.regex"))
        found.append(_choices(so.choice, "structured_outputs.choice"))
        found.append(_text("grammar", so.grammar, "structured_outputs.grammar"))
        if so.json_object:
            found.append(OutputConstraint("json_object", ANY_JSON_OBJECT, "structured_outputs.json_object"))
    if fields.guided_json is not None:
        found.append(OutputConstraint("json_schema", _schema_text(fields.guided_json, "guided_json"), "guided_json"))
    found.append(_text("regex", fields.guided_regex, "guided_regex"))
    found.append(_choices(fields.guided_choice, "guided_choice"))
    found.append(_text("grammar", fields.guided_grammar, "guided_grammar"))
    return found


def _text(kind: ConstraintKind, value: str | None, param: str) -> OutputConstraint | None:
    return None if value is None else OutputConstraint(kind, value, param)


def _choices(value: list[str] | None, param: str) -> OutputConstraint | None:
    return None if value is None else OutputConstraint("choice", json.dumps(value), param)


def check_constraint(
    structured: StructuredOutput | None, constraint: OutputConstraint, *, ignore_eos: bool, min_tokens: int
) -> None:
    """The manifest's limits on a request's constraint (ServingError, 400): structured output declared, the kind
    allowed, the spec within max_spec_bytes, a schema that is a JSON Schema, and no field that would keep the
    output from ending where the constraint does. Whether it compiles is the grammar engine's to say."""
    param = constraint.param
    if structured is None:
        raise ServingError(
            "unsupported_parameter", param=param, detail="this deployment declares no postprocess.structured_output"
        )
    if not structured.request_constraints:
        raise ServingError(
            "unsupported_parameter",
            param=param,
            detail="this deployment takes no output constraint from requests (structured_output.request_constraints)",
        )
    if constraint.kind not in structured.kinds:
        allowed = ", ".join(structured.kinds)
        raise ServingError(
            "unsupported_parameter", param=param, detail=f"{constraint.kind} is not served (only {allowed})"
        )
    size = constraint.size_bytes()
    if size > structured.max_spec_bytes:
        raise ServingError(
            "invalid_constraint", param=param, detail=f"it has {size} bytes; at most {structured.max_spec_bytes}"
        )
    schema = constraint.schema()
    if schema is not None:
        try:
            check_json_schema(schema)
        except ValueError as exc:
            raise ServingError("invalid_constraint", param=param, detail=str(exc)) from None
    check_unended(ignore_eos=ignore_eos, min_tokens=min_tokens)


def check_unended(*, ignore_eos: bool, min_tokens: int) -> None:
    """Refuse (400) the fields that would keep a constrained output from ending where its constraint does."""
    for name, asked in (("ignore_eos", ignore_eos), ("min_tokens", min_tokens > 0)):
        if asked:
            raise ServingError(
                "invalid_request",
                param=name,
                detail=f"{name} cannot be combined with an output constraint, which "
                "ends the output when it is complete",
            )


def served_constraint(
    structured: StructuredOutput | None, output_schema: dict[str, Any] | None, fields: ConstraintFields
) -> OutputConstraint | None:
    """The constraint a request is decoded under, with the manifest's whitespace rule: its own, else the
    manifest's output_schema where structured_output.enforce_output_schema says so, else None."""
    own = fields.output_constraint()
    if structured is None:
        return own
    compact = structured.whitespace == "compact"
    if own is not None:
        return dataclasses.replace(own, compact=compact)
    if not structured.enforce_output_schema or output_schema is None:
        return None
    spec = json.dumps(output_schema, separators=(",", ":"))
    return OutputConstraint("json_schema", spec, "postprocess.output_schema", compact)
