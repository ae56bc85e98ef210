"""#40 on a real engine: `gate profile`, `gate plan --verify` of the quickstart served by vLLM (CPU build).

The knee is measured (a rate kept up with and a higher one missed), the verify bench runs at the claimed
per-replica rate and past it, and the plan's memory is the engine's whole process group: within 25% of the
resident memory this test reads itself (psutil, over every process under the gate command) while the
verify bench runs. Measured wall time: see the module's timing note in docs/capacity-endpoint.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]
SETS = ("runtime.backend=vllm", "runtime.device=cpu", 'runtime.quantization={"method": "none"}',
        "runtime.kv_cache.block_size=32")  # fmt: skip


def _gate(args: list[str], tmp_path: Path, vllm_python: Path) -> subprocess.Popen[str]:
    sets = [x for s in SETS for x in ("--set", s)]
    manifest = str(ROOT / "examples/quickstart/manifest.yaml")
    env = {**os.environ, "SERVEGATE_HOME": str(tmp_path / "home"), "SERVEGATE_VLLM_PYTHON": str(vllm_python),
           "COLUMNS": "80"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "servegate.cli", *args[:1], manifest, *sets, *args[1:]],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _group_rss(root: int) -> int:
    """The resident memory of every process below `root` (the gate command itself, the client, left out)."""
    import psutil

    total = 0
    for child in psutil.Process(root).children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def test_profile_plan_and_verify_the_quickstart_on_vllm(vllm_python: Path, tmp_path: Path) -> None:
    pytest.importorskip("psutil")
    began = time.monotonic()
    profiled = _gate(["profile", "--repeats", "2", "--json", "profile.json"], tmp_path, vllm_python)
    out, err = profiled.communicate(timeout=1200)
    assert profiled.returncode == 0, err[-3000:]
    profile_s = time.monotonic() - began
    box = json.loads((tmp_path / "profile.json").read_text())["fit"]["black_box"]
    knee = box["knee"]
    runs = [(r["rate_rps"], r["kept_up"]) for r in knee["rates"]]
    # the knee is bracketed by measured rates: one kept up with, a higher one not (the lowest rate missed is run
    # twice, and the repeat may keep up)
    assert knee["measured_knee_rps"] is not None and knee["missed_rps"] is not None, knee
    assert (knee["measured_knee_rps"], True) in runs and (knee["missed_rps"], False) in runs, runs
    assert knee["measured_knee_rps"] < knee["missed_rps"]
    [said] = [x for x in out.splitlines() if x.startswith("knee: ")]
    assert said.startswith("knee: measured between")
    # the steady stream below the knee, on which the machine's drift is fitted, ran and was answered
    stream = box["stream"]
    assert stream["rate_rps"] <= 0.7 * knee["measured_capacity_rps"] + 1e-9 and stream["requests"] >= 20, stream
    assert stream["measured_p50_ms"] > 0 and [x for x in out.splitlines() if x.startswith("steady stream: ")]

    planned = _gate(["plan", "--requests", "100", "--verify", "--json", "plan.json"], tmp_path, vllm_python)
    peak = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                peak = max(peak, _group_rss(planned.pid))
            except Exception:  # noqa: BLE001 - the process may end between two reads
                pass
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = planned.communicate(timeout=1200)
    done.set()
    watcher.join()
    assert planned.returncode == 0, err[-3000:]
    data = json.loads((tmp_path / "plan.json").read_text())
    claimed = data["per_replica"]["rate_rps"]
    assert data["per_replica"]["high_rps"] > data["per_replica"]["low_rps"]  # never of zero width
    points = {p["point"]: p for p in data["verify"]["points"]}
    # the verify bench covers the claimed capacity: at it, and past it
    assert points["claimed capacity"]["rate_rps"] == pytest.approx(claimed)
    assert points["past the claim"]["rate_rps"] > claimed
    assert all(p["measured_requests_per_s"] > 0 for p in points.values())
    assert [x for x in out.splitlines() if x.startswith("claimed capacity (")], out
    assert data["knee"]["kept_up_rps"] == knee["measured_knee_rps"] and not data["knee"]["extrapolated"]
    [where] = [x for x in out.splitlines() if x.startswith("per replica vs the profile: knee measured between")]
    # the memory figure is the engine's whole process group: within 25% of what this test read
    memory = data["memory"]
    assert memory["modelled"] and "measured by `gate profile`" in memory["runtime_overhead_source"]
    assert peak > 0 and abs(memory["total_bytes"] - peak) <= 0.25 * peak, (memory["total_bytes"], peak)
    print(
        f"\nprofile {profile_s:.0f} s, plan + verify {time.monotonic() - began - profile_s:.0f} s; knee "
        f"{knee['measured_knee_rps']:.3g}-{knee['missed_rps']:.3g} requests/s (predicted "
        f"{knee['predicted_capacity_rps']:.3g}); per replica {claimed:.3g} ({data['per_replica']['low_rps']:.3g}-"
        f"{data['per_replica']['high_rps']:.3g}, {data['per_replica']['binding']}); memory planned "
        f"{memory['total_bytes'] / 2**30:.2f} GiB, read {peak / 2**30:.2f} GiB\n{where}"
    )
    for p in points.values():
        print(f"{p['point']}: {p['offered']}, {p['measured_requests_per_s']:.3g} requests/s measured vs "
              f"{p['predicted_requests_per_s']:.3g} predicted")  # fmt: skip
