"""The base of every record in the check report: one pydantic model writes the JSON and reads it back.

A record's fields are the report's keys, in order. A field declared with `unmeasured()` is a measurement only
some runs make: it is left out of the JSON when it was not made, and read back as None. Records read from a
gate's own objects by attribute (`from_attributes`), so a gate builds its measurements as it likes and the
report holds exactly what the schema says.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, SerializerFunctionWrapHandler, model_serializer
from pydantic.config import JsonDict

Verdict = Literal["pass", "fail", "warn", "skipped", "unavailable"]
"""A gate's verdict. `unavailable`: the engine the gate needed could not be reached or failed too many requests;
nothing was measured, and it blocks like a failure (exit 2: a broken deployment is not an inferior model)."""
VERDICTS: tuple[Verdict, ...] = ("pass", "fail", "warn", "skipped", "unavailable")

JsonObject = dict[str, JsonValue]
"""A JSON object another command's schema owns (the bench's latency figures): kept as written."""

_OMIT: JsonDict = {"omit_if_none": True}


def unmeasured() -> Any:
    """A field's default for a measurement only some runs make: None, and left out of the JSON when None."""
    return Field(default=None, json_schema_extra=_OMIT)


_Record = TypeVar("_Record", bound="ReportRecord")


class ReportRecord(BaseModel):
    """One record of the check report: unknown keys fail, values are immutable, infinities stay infinities."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        from_attributes=True,
        use_attribute_docstrings=True,
        ser_json_inf_nan="constants",
    )

    def updated(self: _Record, **changes: Any) -> _Record:
        """A copy with `changes`, validated like a new record (so a gate's own objects become records here too;
        pydantic's `model_copy(update=...)` would keep them as they are)."""
        return self.model_validate({**{name: getattr(self, name) for name in type(self).model_fields}, **changes})

    @model_serializer(mode="wrap")
    def _leave_out_unmeasured(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in _omit_if_none(type(self)):
                if data.get(name, 0) is None:
                    del data[name]
            if "ran_on" in data:  # a remote's label is added after its gate ran: it stays last
                data["ran_on"] = data.pop("ran_on")
        return data


_OMITTED: dict[type[ReportRecord], frozenset[str]] = {}


def _omit_if_none(kind: type[ReportRecord]) -> frozenset[str]:
    """The fields of `kind` declared with `unmeasured()` (worked out once per class)."""
    if kind not in _OMITTED:
        _OMITTED[kind] = frozenset(name for name, f in kind.model_fields.items() if f.json_schema_extra == _OMIT)
    return _OMITTED[kind]
