"""Fixtures of the capacity tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from capacity_helpers import write_model_dir


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A directory holding only a tiny Llama config.json (no weights)."""
    return write_model_dir(tmp_path)
