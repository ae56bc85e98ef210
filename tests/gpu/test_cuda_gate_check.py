"""`gate check examples/quickstart/manifest.yaml --set runtime.device=cuda` passes: every gate, the quickstart
served on the GPU (its fallback too: `device: auto` picks CUDA there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cuda_cases import DEVICE, gpu

from servegate.contracts.loading import load_manifest

pytestmark = gpu
ROOT = Path(__file__).parents[2]
MANIFEST = ROOT / "examples/quickstart/manifest.yaml"


def test_the_quickstart_passes_gate_check_on_cuda(tmp_path: Path) -> None:
    report, junit = tmp_path / "check.json", tmp_path / "check.xml"
    sets = ["--set", f"runtime.device={DEVICE}"]
    # the quantization gate tests' baseline cache (the same reference form), when they ran before
    env = {**os.environ, "SERVEGATE_CACHE": str(tmp_path.parent / "gate-cache"), "COLUMNS": "200"}
    command = [sys.executable, "-m", "servegate.cli", "check", str(MANIFEST), *sets, "--json", str(report)]
    done = subprocess.run(
        [*command, "--junit", str(junit)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    result = json.loads(report.read_text())
    for gate in result["gates"]:  # printed: the GPU run's output is the record of what each gate measured
        print(f"{gate['name']}: {gate['verdict']}: {gate['reason']}")
        if gate["name"] == "capacity":
            print(json.dumps(gate["measurements"], default=str)[:2000])
    failed = {g["name"]: g["reason"] for g in result["gates"] if g["verdict"] == "fail"}
    assert done.returncode == 0 and not failed, failed
    assert junit.is_file()
    on_device = load_manifest(MANIFEST, [f"runtime.device={DEVICE}"], check_fallback=False)
    assert result["candidate"]["fingerprint"] == on_device.fingerprint
