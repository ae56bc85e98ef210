"""Fixtures of the server tests: temporary folders, the test model, servers stopped at the end of a test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.models import save_tiny_llama
from support.servers import ServerProcess, start_fake_server


@pytest.fixture(scope="session")
def weights_source(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The zoo's tiny-primary when it is built, else a tiny random Llama with the same tokenizer."""
    from servegate.zoo import ZooError, zoo_model_path

    try:
        zoo_model_path("tiny-primary")
        return "zoo:tiny-primary"
    except ZooError:
        return str(save_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A temporary folder per test module (manifests and server logs)."""
    return tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Any]:
    """Start servers inside one test; all are stopped at its end."""
    started: list[ServerProcess] = []

    def start(manifest: dict[str, Any], behaviour: dict[str, Any] | None = None) -> ServerProcess:
        folder = tmp_path / f"server{len(started)}"
        folder.mkdir()
        server = start_fake_server(folder, manifest, behaviour)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
