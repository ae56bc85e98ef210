"""Byte sizes with units ("2GiB", "512MB", 1048576) as used by memory budgets."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: object) -> int:
    """Parse a byte count given as an int or a string with a unit ("2GiB", "512MB", "64KiB")."""
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size such as 2GiB or 1048576 (got {value!r})")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte size cannot be negative (got {value})")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match and match.group(2).lower() in _UNITS:
            return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    raise ValueError(
        f"expected a byte size such as 2GiB, 512MB or 1048576 (got {value!r}); "
        "units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
    )


def format_bytes(n: int | float) -> str:
    """Format a byte count with a binary unit, e.g. 2147483648 -> '2.00 GiB'."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


ByteSize = Annotated[int, BeforeValidator(parse_bytes), PlainSerializer(int, return_type=int)]
"""An integer number of bytes that may be written with a unit in a manifest."""
