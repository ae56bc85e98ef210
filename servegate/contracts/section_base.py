"""The base of every manifest section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every manifest section: unknown keys fail, values are immutable once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
