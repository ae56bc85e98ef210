"""Fixtures of the zoo tests."""

from __future__ import annotations

import pytest
from zoo_helpers import TRAINED


@pytest.fixture(params=TRAINED)
def trained_name(request: pytest.FixtureRequest) -> str:
    """Each trained zoo model's name in turn."""
    return str(request.param)
