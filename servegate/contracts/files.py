"""Writing a file all at once: reports, notes, caches, profiles, plots and rewritten manifests go through here."""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes, mode: int | None = None) -> Path:
    """Write `data` (text as UTF-8) to `path` so that no reader and no crash ever sees half a file.

    The data goes to a file of its own beside `path`, which is then renamed over it (one step on one file
    system); its folder is created when missing, and a file it replaces keeps its permissions unless
    `mode` (e.g. 0o755 for a script) sets them.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # unique per writer: two processes writing the same entry (the output cache) never share a partial file
    partial = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
    try:
        with open(partial, "xb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        if mode is not None:
            os.chmod(partial, mode)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.chmod(partial, stat.S_IMODE(path.stat().st_mode))
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise
    return path
