"""Integrity of what is loaded: tampered weights and pickle files are refused by `gate serve` and `gate run` in
one clear line before anything runs; a malicious pickle is never unpickled; `zoo:` names and `weights.sha256`
file names cannot reach outside their root through `..` or symlinks.

The loader's own unit tests (mismatch message, missing file, opt-in) are tests/runtime/test_weights.py; the
zoo catalogue's symlink check is tests/zoo/test_zoo_catalog.py. Here the user-facing commands are run, the
malicious pickle is real, and names are fuzzed.
"""

from __future__ import annotations

import json
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import reliability_jobs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_engine import MODEL_NAME, manifest_data, model_source
from support.manifests import write_manifest
from support.servers import ServerProcess

from servegate.capacity.bench.local_server import free_port
from servegate.contracts.errors import ManifestError, ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.model.weights import resolve_weights_dir, sha256_of

pytestmark = pytest.mark.reliability


class _Plant:
    """Unpickling this creates a marker file: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def run_gate(folder: Path, *argv: str) -> tuple[int, str]:
    """`gate ARGV` in its own process; (exit code, its output)."""
    log = folder / f"gate-{argv[0]}.log"
    process = reliability_jobs.start("gate_main", list(argv), str(log), str(folder))
    process.join(300)
    if process.is_alive():  # a server that started although it should have refused
        process.kill()
        process.join(30)
    return int(process.exitcode or 0), log.read_text(encoding="utf-8", errors="replace")


def error_lines(output: str) -> list[str]:
    """The CLI's one-line errors."""
    return [line for line in output.splitlines() if line.startswith("error: ")]


@pytest.fixture
def model_copy(tmp_path: Path) -> Path:
    """A private copy of the test model's directory."""
    source = Path(model_source(tmp_path / "src"))
    if not source.is_dir():
        from reliability_engine import model_dir_of

        source = model_dir_of(ServedModel.model_validate(manifest_data(str(source))))
    target = tmp_path / "model"
    shutil.copytree(source, target)
    return target


def _input(folder: Path) -> Path:
    path = folder / "in.jsonl"
    path.write_text(json.dumps({"id": 1, "prompt": "hi", "max_tokens": 2}) + "\n", encoding="utf-8")
    return path


def serve_refusal(folder: Path, manifest: Path) -> tuple[str, int | None]:
    """How `gate serve` refuses: an exit with one error line, or staying up not ready and answering 503.

    Returns (the reason it gives, its exit code).
    """
    port = free_port()
    log = folder / "serve.log"
    process = reliability_jobs.start("gate_main", ["serve", str(manifest), "--port", str(port)], str(log), str(folder))
    server = ServerProcess(process, log, port, folder)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            if not process.is_alive():
                lines = error_lines(server.log())
                assert process.exitcode == 2 and len(lines) == 1, server.log()[-2000:]
                return lines[0], process.exitcode
            try:
                ready = httpx.get(server.url("/ready"), timeout=5)
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            reason = ready.json().get("reason", "")
            if ready.status_code == 503 and "starting" not in reason:
                body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}
                refused = httpx.post(server.url("/v1/completions"), json=body, timeout=30)
                assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_unavailable"
                assert reason in server.log()  # the operator sees it too
                return reason, None
            assert ready.status_code != 200, "a server with tampered weights became ready"
            time.sleep(0.2)
        raise AssertionError(f"gate serve neither refused nor said why:\n{server.log()[-2000:]}")
    finally:
        code = server.stop()
        assert code in (0, 2), code


def test_tampered_weights_are_refused_by_serve_and_run(model_copy: Path, tmp_path: Path, figures: Any) -> None:
    weights = model_copy / "model.safetensors"
    digest = sha256_of(weights)
    data = manifest_data(str(model_copy))
    data["weights"]["sha256"] = {"model.safetensors": digest}
    manifest = write_manifest(tmp_path, data)
    blob = bytearray(weights.read_bytes())
    blob[len(blob) // 2] ^= 0x01  # one bit in the middle of the tensors
    weights.write_bytes(bytes(blob))
    out = tmp_path / "out.jsonl"
    run_code, run_output = run_gate(tmp_path, "run", str(manifest), "--input", str(_input(tmp_path)), "-o", str(out))
    lines = error_lines(run_output)
    figures.set("gate run", f"exit {run_code}: {lines[:1]}")
    assert run_code == 2 and len(lines) == 1, run_output[-2000:]
    assert "checksum mismatch for model.safetensors" in lines[0] and digest in lines[0]
    assert "Traceback" not in run_output
    assert not out.exists()  # refused before a single request ran
    reason, serve_code = serve_refusal(tmp_path, manifest)
    how = f"exit {serve_code}" if serve_code is not None else "stays up, /ready 503, requests 503"
    figures.set("gate serve", f"{how}: {reason}")
    assert "checksum mismatch for model.safetensors" in reason


@pytest.mark.parametrize("opt_in", [False, True])
def test_a_malicious_pickle_is_never_unpickled(model_copy: Path, tmp_path: Path, figures: Any, opt_in: bool) -> None:
    """Pickle-only weights: refused without the opt-in; with it, the loader still must not execute the pickle."""
    marker = tmp_path / "PWNED"
    (model_copy / "model.safetensors").unlink()
    (model_copy / "pytorch_model.bin").write_bytes(pickle.dumps({"model.embed_tokens.weight": _Plant(marker)}))
    data = manifest_data(str(model_copy))
    if opt_in:
        data["weights"].update(format="pickle", allow_pickle=True)
    manifest = write_manifest(tmp_path, data)
    code, output = run_gate(
        tmp_path, "run", str(manifest), "--input", str(_input(tmp_path)), "-o", str(tmp_path / "o.jsonl")
    )
    lines = error_lines(output)
    figures.set(f"allow_pickle {opt_in}", f"exit {code}: {lines[:1]}; code ran: {marker.exists()}")
    assert not marker.exists(), "the pickle was executed"
    assert code == 2 and len(lines) == 1, output[-2000:]
    if not opt_in:
        assert "pickle" in lines[0] and "allow_pickle" in lines[0]


def test_a_pickle_beside_safetensors_is_ignored(model_copy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    (model_copy / "pytorch_model.bin").write_bytes(pickle.dumps(_Plant(marker)))
    manifest = write_manifest(tmp_path, manifest_data(str(model_copy)))
    out = tmp_path / "o.jsonl"
    code, output = run_gate(tmp_path, "run", str(manifest), "--input", str(_input(tmp_path)), "-o", str(out))
    assert code == 0, output[-2000:]
    assert not marker.exists() and json.loads(out.read_text())["id"] == 1


ZOO_NAMES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "..",
            "../..",
            "tiny-primary/..",
            "tiny-primary/../../etc",
            "%2e%2e",
            "tiny-primary\x00",
            "./tiny-primary",
            "/etc",
            "~",
            "tiny-primary/",
            "TINY-PRIMARY",
            "tiny_primary",
            "..\\..",
            "tiny-primary/../tiny-fallback",
            "\u2024\u2024",
            "tiny-primary ",
        ]
    ),  # fmt: skip
    st.lists(st.sampled_from(["..", ".", "tiny-primary", "etc", "", "x"]), max_size=6).map("/".join),
)


def test_zoo_names_never_resolve_outside_the_zoo(figures: Any) -> None:
    from servegate.zoo.catalog import MODELS_DIR

    outcomes = {"refused by the manifest": 0, "refused by the loader": 0, "inside the zoo": 0}

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(name=ZOO_NAMES)
    def probe(name: str) -> None:
        try:
            served = ServedModel.model_validate({"name": "z", "weights": {"source": f"zoo:{name}"}})
        except ValueError:  # pydantic's ValidationError
            outcomes["refused by the manifest"] += 1
            return
        try:
            path = resolve_weights_dir(served)
        except ServegateError:
            outcomes["refused by the loader"] += 1
            return
        assert path.resolve().is_relative_to(MODELS_DIR.resolve()), (name, path)
        outcomes["inside the zoo"] += 1

    probe()
    for key, value in outcomes.items():
        figures.count(f"zoo names {key}", value)
    figures.count("zoo names resolving outside the zoo", 0)


def test_a_zoo_model_symlinked_out_of_the_zoo_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import servegate.zoo.catalog as catalog

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("{}", encoding="utf-8")
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    (zoo / "tiny-primary").symlink_to(outside, target_is_directory=True)
    monkeypatch.setattr(catalog, "MODELS_DIR", zoo)
    served = ServedModel.model_validate({"name": "z", "weights": {"source": "zoo:tiny-primary"}})
    with pytest.raises(ServegateError, match="outside the zoo"):
        resolve_weights_dir(served)


SHA = "0" * 64


def test_checksum_file_names_stay_inside_the_weights_directory(tmp_path: Path, figures: Any) -> None:
    root = tmp_path / "weights"
    root.mkdir()
    outcomes = {"refused": 0, "inside": 0}

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(name=st.text(min_size=1, max_size=20) | st.lists(st.sampled_from(["..", ".", "a", "", "/"]),
                                                             min_size=1, max_size=5).map("/".join))  # fmt: skip
    def probe(name: str) -> None:
        try:
            ServedModel.model_validate({"name": "z", "weights": {"source": str(root), "sha256": {name: SHA}}})
        except (ValueError, ManifestError):
            outcomes["refused"] += 1
            return
        if "\x00" in name:  # not a path the OS can open; the loader's is_file() says no
            outcomes["refused"] += 1
            return
        assert (root / name).resolve().is_relative_to(root.resolve()), name
        outcomes["inside"] += 1

    probe()
    figures.count("sha256 names refused", outcomes["refused"])
    figures.count("sha256 names kept inside the weights directory", outcomes["inside"])
