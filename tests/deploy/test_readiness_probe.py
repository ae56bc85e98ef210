"""readiness_probe.py, generated from the warm-up checks, run against a fake engine: ready, not ready, unreachable."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from support.fake_deployment import EngineState, fake_engine

from servegate.contracts.manifest import ServedModel
from servegate.deploy.probe_script import readiness_probe_script
from servegate.runtime.remote.server_process import free_port

SERVED = ServedModel.model_validate(
    {
        "name": "verify-me",
        "weights": {"source": "zoo:tiny-primary"},
        "preprocess": {"max_input_tokens": 64, "tenant_from": "header"},
        "runtime": {"max_model_len": 128, "warmup": [{"prompt": "12+34=", "expect": "46", "max_tokens": 4}]},
        "postprocess": {"max_output_tokens": 32},
    }
)


def _probe(script: Path, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), url], capture_output=True, text=True, timeout=60)


def test_the_probe_passes_only_when_the_warmup_outputs_match(tmp_path: Path) -> None:
    script = tmp_path / "readiness_probe.py"
    script.write_text(readiness_probe_script(SERVED))
    with fake_engine(EngineState()) as url:
        ready = _probe(script, url + "/v1")
    assert ready.returncode == 0 and "ready: 1 warm-up check(s) passed" in ready.stdout
    with fake_engine(replace(EngineState(), completions={"12+34=": "47"})) as url:
        wrong = _probe(script, url)
    assert wrong.returncode == 1 and "gave '47', the manifest expects '46'" in wrong.stdout
    port = free_port()  # a port nobody listens on
    down = _probe(script, f"http://127.0.0.1:{port}")
    assert down.returncode == 2 and "cannot be reached" in down.stdout


def test_the_probe_is_deterministic_and_names_the_tenant() -> None:
    text = readiness_probe_script(SERVED)
    assert text == readiness_probe_script(SERVED)
    assert '"X-Tenant": "servegate-readiness-probe"' in text and SERVED.fingerprint[:12] in text
