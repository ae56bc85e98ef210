"""Manifests written to disk for tests that start servers and subprocesses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servegate.contracts.files import write_atomic


def write_manifest(folder: Path, data: dict[str, Any], name: str = "manifest.json") -> Path:
    """Write a manifest dict as JSON (manifests may be YAML or JSON), atomically, and return its path."""
    return write_atomic(folder / name, json.dumps(data, indent=2))
