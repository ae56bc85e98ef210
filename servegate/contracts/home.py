"""servegate's own folder for what it keeps between runs: fetched zoo models, profiles, GGUF conversions, kernels."""

from __future__ import annotations

import os
from pathlib import Path

from servegate.contracts.errors import ServegateError


def servegate_home() -> Path:
    """$SERVEGATE_HOME, or ~/.cache/servegate when it is unset or empty (read at each call, so tests may set it)."""
    return Path(os.environ.get("SERVEGATE_HOME") or Path.home() / ".cache" / "servegate")


def make_kept_folder(
    folder: Path, what: str, variable: str = "SERVEGATE_HOME", error: type[ServegateError] = ServegateError
) -> None:
    """Create `folder` (and its parents) to keep `what` in, or raise `error` in one line naming the variable to set."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise error(
            f"cannot keep {what} under {folder} ({type(exc).__name__}: {exc}): set {variable} to a writable folder"
        ) from None
