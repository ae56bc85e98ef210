"""Fixtures of the serving-note tests: the quickstart manifest with checksums, and an editable copy of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from note_evidence import QUICKSTART, quickstart_sets

from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel


@pytest.fixture
def served() -> ServedModel:
    """The quickstart example, with weight checksums."""
    return load_manifest(QUICKSTART, quickstart_sets())


@pytest.fixture
def quickstart_copy(tmp_path: Path) -> Path:
    """A copy of the quickstart manifest (and its fallback) that a test may edit."""
    for name in ("manifest.yaml", "fallback.yaml"):
        (tmp_path / name).write_text((QUICKSTART.parent / name).read_text(encoding="utf-8"), encoding="utf-8")
    return tmp_path / "manifest.yaml"
