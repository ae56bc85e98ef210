"""Crashes: `gate run` killed with SIGKILL at random points and resumed loses and repeats nothing; a server
killed mid-request gives its clients a clean connection error at once, and leaves no half-written file.

`gate run` here is the CLI entry point with the user's argv, in its own process (reliability_jobs.py),
killed when its output has reached a randomly drawn number of lines (0 included: killed while loading).
The torn-last-line repair on a hand-made file is tests/runtime/test_offline.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import reliability_jobs
from reliability_engine import MODEL_NAME, manifest_data, model_source
from reliability_server import start_server
from support.manifests import write_manifest
from support.servers import ServerProcess

pytestmark = pytest.mark.reliability


def job_lines(n: int) -> list[dict[str, Any]]:
    """n requests (ids int and str, completions and chats), two of them invalid (they get error lines)."""
    lines: list[dict[str, Any]] = []
    for i in range(n):
        rid: int | str = i if i % 3 else f"req-{i}"
        if i % 5 == 4:
            lines.append({"id": rid, "messages": [{"role": "user", "content": f"chat {i}"}], "max_tokens": 16,
                          "temperature": 0})  # fmt: skip
        else:
            lines.append({"id": rid, "prompt": f"line {i}: tell me", "max_tokens": 16, "temperature": 0})
    lines[7] = {"id": "bad-temperature", "prompt": "x", "temperature": 9}
    lines[13] = {"id": "bad-field", "prompt": "x", "colour": "blue"}
    return lines


def complete_lines(path: Path) -> list[bytes]:
    """The output's whole lines (a torn last line excluded)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1].splitlines(keepends=True)


def run_job(folder: Path, manifest: Path, src: Path, out: Path, tag: str) -> Any:
    """Start `gate run MANIFEST --input SRC --output OUT` in its own process."""
    argv = ["run", str(manifest), "--input", str(src), "--output", str(out)]
    return reliability_jobs.start("gate_main", argv, str(folder / f"{tag}.log"), str(folder))


def wait_for_lines(process: Any, out: Path, target: int, timeout_s: float = 300.0) -> bool:
    """Wait until OUT has >= target whole lines (True) or the process ended first (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(complete_lines(out)) >= target:
            return True
        if not process.is_alive():
            return False
        time.sleep(0.02)
    raise AssertionError(f"no progress to {target} lines in {timeout_s} s")


@pytest.mark.parametrize(
    ("lines", "kills"), [pytest.param(40, 6, id="fast"), pytest.param(200, 20, id="long", marks=pytest.mark.slow)]
)
def test_gate_run_killed_at_random_points_resumes_without_loss_or_repeat(
    tmp_path: Path, figures: Any, lines: int, kills: int
) -> None:
    data = manifest_data(model_source(tmp_path), batching={"mode": "offline", "max_batch_size": 4})
    manifest = write_manifest(tmp_path, data)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in job_lines(lines)), encoding="utf-8")

    reference = tmp_path / "reference.jsonl"
    first = run_job(tmp_path, manifest, src, reference, "reference")
    first.join(600)
    assert first.exitcode == 0, (tmp_path / "reference.log").read_text()[-3000:]
    expected = reference.read_bytes().splitlines(keepends=True)
    assert len(expected) == lines

    out = tmp_path / "out.jsonl"
    rng = random.Random(11)
    targets = sorted(rng.sample(range(lines - 1), kills - 1)) + [0]  # one kill while still loading
    kill_points, torn, finished_early = [], 0, 0
    for n, target in enumerate(sorted(targets)):
        process = run_job(tmp_path, manifest, src, out, f"run{n}")
        before = len(complete_lines(out))
        reached = target <= before or wait_for_lines(process, out, target)
        if not reached or not process.is_alive():
            finished_early += 1
            process.join(600)
            continue
        os.kill(process.pid, signal.SIGKILL)
        process.join(60)
        if process.exitcode == 0:  # it wrote its last line and exited between the check and the signal
            finished_early += 1
            continue
        assert process.exitcode == -signal.SIGKILL
        written = complete_lines(out)
        kill_points.append(len(written))
        torn += out.exists() and not out.read_bytes().endswith(b"\n") and out.stat().st_size > 0
        assert written == expected[: len(written)], "a killed run wrote a line that differs or repeats"
    final = run_job(tmp_path, manifest, src, out, "final")
    final.join(600)
    assert final.exitcode == 0, (tmp_path / "final.log").read_text()[-3000:]

    result = out.read_bytes().splitlines(keepends=True)
    ids = [json.loads(line)["id"] for line in result]
    figures.count("kill points (SIGKILL)", len(kill_points))
    figures.set("lines written when killed", kill_points)
    figures.count("runs that finished before their kill point", finished_early)
    figures.count("torn last lines repaired on resume", int(torn))
    figures.count("input lines", lines)
    figures.count("lines lost", len(set(json.loads(x)["id"] for x in expected) - set(ids)))
    figures.count("lines duplicated", len(ids) - len(set(ids)))
    differing = sum(a != b for a, b in zip(result, expected, strict=False))
    figures.count("lines differing from an uninterrupted run", differing)
    assert len(kill_points) >= 5
    assert result == expected  # every line once, in input order, same bytes as the uninterrupted run
    stray = sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".tmp", ".part") or p.name.startswith(".#"))
    assert not stray, stray


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def _kill_during(kind: str, server: ServerProcess) -> tuple[str, float, list[str]]:
    """Send one request of `kind`, SIGKILL the server once it is in flight; (client error, seconds to it, events)."""
    body = {"model": MODEL_NAME, "prompt": "tell me a long story", "max_tokens": 32, "temperature": 0,
            "ignore_eos": True, "stream": kind == "stream"}  # fmt: skip
    events: list[str] = []
    killed_at: list[float] = []
    in_flight = threading.Event()

    def killer() -> None:
        in_flight.wait(30)
        time.sleep(0.3 if kind != "stream" else 0.0)
        killed_at.append(time.monotonic())
        os.kill(server.pid, signal.SIGKILL)

    thread = threading.Thread(target=killer)
    thread.start()
    error = "no error"
    try:
        with httpx.Client(timeout=httpx.Timeout(60.0)) as client:
            if kind == "stream":
                with client.stream("POST", server.url("/v1/completions"), json=body) as response:
                    for line in response.iter_lines():
                        if line:
                            events.append(line)
                            in_flight.set()
            else:
                in_flight.set()
                client.post(server.url("/v1/completions"), json=body)
    except httpx.TransportError as exc:
        error = type(exc).__name__
    thread.join(30)
    return error, time.monotonic() - killed_at[0], events


@pytest.mark.parametrize("kind", ["stream", "request"])
def test_server_killed_mid_request_gives_a_clean_error_and_no_half_written_file(
    tmp_path: Path, figures: Any, kind: str
) -> None:
    data = manifest_data(model_source(tmp_path / "model"), failure_policy={"request_timeout_s": 30})
    server = start_server(tmp_path / "server", data, step_delay_s=0.05)
    server.wait_ready()
    files_before = _files(server.cwd)
    error, seconds, events = _kill_during(kind, server)
    server.process.join(30)
    figures.set("client error", error)
    figures.timings("kill -> client error", [seconds])
    figures.count("SSE events received before the kill", len(events))
    assert server.process.exitcode == -signal.SIGKILL
    assert error in {"RemoteProtocolError", "ReadError", "ConnectError"}, error
    assert seconds < 5.0  # a connection error at once, not a hang until a timeout
    for line in events:  # what arrived is whole events, never a cut JSON chunk
        assert line.startswith("data: ") and (line == "data: [DONE]" or json.loads(line[6:]))
    if kind == "stream":
        assert events and events[-1] != "data: [DONE]"  # it really was cut mid-stream
    files_after = _files(server.cwd)
    new = {name for name in files_after if name not in files_before} - {"server.log"}
    assert not new, new  # nothing half-written: the server writes no files while serving
    changed = {name for name, size in files_before.items() if files_after.get(name) != size} - {"server.log"}
    assert not changed, changed
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url("/health"), timeout=5)
    server.kill()
