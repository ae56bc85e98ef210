"""servegate's own server as the remote of an endpoint manifest, run by uvicorn in a thread on a free port.

A plain OpenAI-compatible remote: it answers as `gate serve` does, with logprobs but no token ids (only vLLM
sends those), like TGI, SGLang or llama.cpp. `with ServegateRemote(manifest) as remote: remote.url`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from servegate.capacity.bench.local_server import free_port
from servegate.contracts.manifest import ServedModel


@dataclass
class ServegateRemote:
    """`gate serve` of `manifest` in this process; `url` is its API base (…/v1)."""

    manifest: dict[str, Any]
    port: int = field(default_factory=free_port)
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The API base URL (…/v1)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ServegateRemote:
        from servegate.server import create_app

        app = create_app(ServedModel.model_validate(self.manifest))
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        end = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/ready", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > end or not self._thread.is_alive():
                self.__exit__()
                raise RuntimeError("servegate's server did not get ready")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=30)
