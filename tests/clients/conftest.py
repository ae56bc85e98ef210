"""Fixtures of the real-client tests: the served model's weights and a `gate serve` per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from clients_harness import GateServe, manifest


@pytest.fixture(scope="module")
def gate_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateServe]:
    """`gate serve` over the zoo's tiny-primary (the clients' tests need its trained arithmetic)."""
    from servegate.zoo import ZooError, zoo_model_path

    try:
        zoo_model_path("tiny-primary")
    except ZooError:
        pytest.skip("the zoo's tiny-primary is not built")
    server = GateServe(Path(tmp_path_factory.mktemp("gate-serve")), manifest("zoo:tiny-primary"))
    server.wait_ready()
    yield server
    assert server.stop() == 0
