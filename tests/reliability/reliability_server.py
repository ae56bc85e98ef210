"""Server processes for the reliability tests: `gate serve` (or a slowed copy) on a free 127.0.0.1 port."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reliability_jobs
from support.manifests import write_manifest
from support.servers import ServerProcess

from servegate.capacity.bench.local_server import free_port


def start_server(folder: Path, manifest: dict[str, Any], step_delay_s: float = 0.0) -> ServerProcess:
    """`gate serve MANIFEST --port N` (a slowed copy when step_delay_s > 0), working in `folder`; not yet ready."""
    folder.mkdir(parents=True, exist_ok=True)
    path = write_manifest(folder, manifest)
    port, log = free_port(), folder / "server.log"
    if step_delay_s > 0:
        process = reliability_jobs.start("serve_slowed", str(path), port, step_delay_s, str(log), str(folder))
    else:
        argv = ["serve", str(path), "--host", "127.0.0.1", "--port", str(port)]
        process = reliability_jobs.start("gate_main", argv, str(log), str(folder))
    return ServerProcess(process, log, port, folder)
