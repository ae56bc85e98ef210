"""The manifest's own server for `gate bench`, `gate profile` and `gate plan --verify`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from capacity_helpers import manifest

from servegate.capacity.bench.local_server import LocalServer
from servegate.contracts.errors import ServegateError


def test_a_model_that_cannot_load_fails_the_start_at_once_with_the_reason(model_dir: Path) -> None:
    served = manifest(model_dir)  # a config.json and no weights
    began = time.monotonic()
    with pytest.raises(ServegateError) as failed:
        LocalServer(served, startup_timeout_s=600).start()
    assert time.monotonic() - began < 120  # not the 600 s startup timeout
    message = str(failed.value)
    assert message.startswith("the local server for tiny cannot serve: the model failed to load")
    assert "holds no weight files" in message
