"""The child-server lifecycle vLLM's and llama.cpp's launchers share (runtime/remote/server_process.py), on a small
stand-in server: started in its own process group, ready once it completes, its log, /metrics and memory read, and
the whole group gone after stop; a server that dies names its log."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from servegate.runtime.remote.llamacpp_process import LlamaCppLaunchError, LlamaCppServer
from servegate.runtime.remote.server_process import free_port
from servegate.runtime.remote.vllm_process import VllmLaunchError, VllmServer

STAND_IN = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def _send(self, code, body, kind="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, "{}")
        elif self.path == "/metrics":
            self._send(200, "# TYPE requests_total counter\\nrequests_total{kind=\\"x\\"} 3\\n", "text/plain")
        else:
            self._send(404, "{}")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(200, json.dumps({"choices": [{"text": "2"}]}))

    def log_message(self, *args):
        print("request", *args, flush=True)

print("stand-in listening", flush=True)
HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@dataclass(frozen=True)
class StandInLaunch:
    """A launch whose command runs the stand-in server (or a command that dies at once)."""

    script: Path
    port: int
    cache_root: Path
    dies: bool = False
    served_model_name: str = "m"
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        if self.dies:
            return [sys.executable, "-c", "import sys; print('no model here', flush=True); sys.exit(3)"]
        return [sys.executable, str(self.script), str(self.port)]

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return dict(os.environ)


@pytest.fixture
def launch(tmp_path: Path) -> StandInLaunch:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN, encoding="utf-8")
    return StandInLaunch(script, free_port(), tmp_path / "cache")


@pytest.mark.parametrize("server_type", [VllmServer, LlamaCppServer])
def test_a_server_starts_in_its_own_group_answers_and_is_gone_after_stop(
    server_type: type[VllmServer] | type[LlamaCppServer], launch: StandInLaunch, tmp_path: Path
) -> None:
    with server_type(launch, tmp_path / "logs" / "server.log") as server:  # type: ignore[arg-type]
        assert server.wait_ready(timeout_s=60) == "2"
        assert server.ready_after_s is not None and server.ready_after_s > 0
        process = server.process
        assert process is not None and os.getpgid(process.pid) == process.pid  # its own group
        assert server.metrics()["requests_total"] == [({"kind": "x"}, 3.0)]
        rss = server.group_rss_bytes()
        assert rss is not None and rss > 1_000_000  # a Python interpreter's pages, in bytes
        assert any("stand-in listening" in line for line in server.log_tail())
    assert server.process is None and process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)
    if server_type is VllmServer:
        assert launch.cache_root.is_dir()  # vLLM's cache folder is made before it starts


SERVERS_AND_ERRORS = [(VllmServer, VllmLaunchError), (LlamaCppServer, LlamaCppLaunchError)]


@pytest.mark.parametrize(("server_type", "error"), SERVERS_AND_ERRORS)
def test_a_server_that_exits_names_its_log(
    server_type: type[VllmServer] | type[LlamaCppServer], error: type[Exception], tmp_path: Path, launch: StandInLaunch
) -> None:
    dying = StandInLaunch(launch.script, launch.port, launch.cache_root, dies=True)
    log = tmp_path / "server.log"
    server = server_type(dying, log)  # type: ignore[arg-type]
    server.start()
    try:
        with pytest.raises(error, match=r"exited with status 3 before it was ready(.|\n)*no model here(.|\n)*full log"):
            server.wait_ready(timeout_s=60)
        with pytest.raises(error, match="already started"):
            server.start()
    finally:
        server.stop()
