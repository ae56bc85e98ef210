"""The manifest's `postprocess.structured_output` section: which output constraints requests may bring, and how
they are enforced (a grammar engine's token mask, applied in the sampler)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from servegate.contracts.section_base import Section

ConstraintKind = Literal["json_object", "json_schema", "regex", "choice", "grammar"]
"""What an output constraint asks for: any JSON object, JSON matching a schema, text matching a regular
expression, exactly one of a list of strings, or text in a context-free grammar (Lark or GBNF)."""

CONSTRAINT_KINDS: tuple[ConstraintKind, ...] = ("json_object", "json_schema", "regex", "choice", "grammar")


class StructuredOutput(Section):
    """Constrained decoding: requests' `response_format`, `structured_outputs` and `guided_*` fields, enforced as a
    token mask so every finished output satisfies its constraint. Absent: those fields are refused
    (unsupported_parameter). A constraint that does not compile, or is larger than max_spec_bytes, is refused
    with invalid_constraint (400)."""

    backend: Literal["llguidance"] = "llguidance"
    """The grammar engine that computes each step's allowed tokens (llguidance, one of vLLM's backends)."""
    request_constraints: bool = True
    """Whether requests may bring their own constraint; false refuses every one (unsupported_parameter), for a
    deployment that decodes every answer under its own output_schema (enforce_output_schema)."""
    kinds: list[ConstraintKind] = Field(default_factory=lambda: list(CONSTRAINT_KINDS), min_length=1)
    """The constraint kinds requests may ask for; any other is refused with unsupported_parameter."""
    max_spec_bytes: int = Field(default=65_536, ge=16, le=16_777_216)
    """Largest constraint accepted: the UTF-8 bytes of its schema (as compact JSON), regex, choices or grammar."""
    whitespace: Literal["any", "compact"] = "any"
    """JSON whitespace between tokens: `any` allows it as JSON does (vLLM's default); `compact` allows none,
    which keeps a small model from spending its tokens on blank lines."""
    enforce_output_schema: bool = False
    """Enforce postprocess.output_schema as the constraint of every request that brings none of its own."""

    @model_validator(mode="after")
    def _something_to_enforce(self) -> StructuredOutput:
        if not self.request_constraints and not self.enforce_output_schema:
            raise ValueError("request_constraints: false needs enforce_output_schema: true, or nothing is enforced")
        return self
