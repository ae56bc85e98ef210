"""servegate's own folder for what it keeps between runs: fetched zoo models, profiles, GGUF conversions."""

from __future__ import annotations

import os
from pathlib import Path


def servegate_home() -> Path:
    """$SERVEGATE_HOME, or ~/.cache/servegate when it is unset or empty (read at each call, so tests may set it)."""
    return Path(os.environ.get("SERVEGATE_HOME") or Path.home() / ".cache" / "servegate")
