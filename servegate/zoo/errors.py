"""The zoo's error type and the name checks every zoo lookup goes through."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path

# Lowercase letters, digits, "-" and "_": no "/", no ".", so a name can never climb out of the zoo.
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class ZooError(ValueError):
    """A zoo model, suite or metric that does not exist or cannot be used; the message says why."""


def check_name(kind: str, name: str, available: Iterable[str]) -> str:
    """Return ``name`` when it is one of ``available``; otherwise raise a ``ZooError`` that helps."""
    names = sorted(available)
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ZooError(
            f"invalid zoo {kind} name {name!r}: use lowercase letters, digits, '-' or '_' "
            f"(available: {', '.join(names)})"
        )
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ZooError(f"unknown zoo {kind} {name!r}: {hint}available: {', '.join(names)}")
    return name


def inside(root: Path, path: Path) -> Path:
    """Resolve ``path`` (following symlinks) and refuse it unless it stays under ``root``."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise ZooError(f"zoo path {path} resolves to {resolved}, outside the zoo root {root}")
    return resolved
