"""#37 item 7 on the real engine: a black-box `gate profile` and `gate plan --verify` of llama-server serving the
Q8_0 build (examples/smollm2/llamacpp-capacity.yaml), servegate's gateway in front as `gate serve` runs it.

The knee is measured (a rate kept up with and a higher one missed, every request answered), the plan's memory is
the gateway's and llama-server's processes as the profile read them, and the verify bench runs at the claimed
per-replica rate and past it. llama.cpp's threads spin at every step's barriers, so on a machine whose cores are
busy with other work its steps slow down many times over (docs/llamacpp.md, "Capacity"): run it on quiet cores.
It takes 8-12 minutes, so it is marked slow as well: `make engines-slow` runs it, `make engines` does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from llamacpp_support import EXAMPLES, Q8_0, llama_server_binary

pytestmark = [pytest.mark.engines, pytest.mark.slow]  # 8-12 min: `make engines-slow`, not in `.ci/run`

MANIFEST = EXAMPLES / "llamacpp-capacity.yaml"


def _gate(args: list[str], tmp_path: Path, binary: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SERVEGATE_HOME": str(tmp_path / "home"), "SERVEGATE_LLAMACPP_SERVER": str(binary),
           "COLUMNS": "80"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "servegate.cli", args[0], str(MANIFEST), *args[1:]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip


@pytest.mark.timeout(1500)
def test_profile_plan_and_verify_of_llama_server(tmp_path: Path) -> None:
    binary = llama_server_binary()
    if not Q8_0.is_file():
        pytest.skip(f"{Q8_0} is missing: run `make gguf-builds`")
    began = time.monotonic()
    profiled = _gate(["profile", "--repeats", "2", "--json", "profile.json"], tmp_path, binary)
    assert profiled.returncode == 0, profiled.stderr[-3000:]
    profile_s = time.monotonic() - began
    box = json.loads((tmp_path / "profile.json").read_text())["fit"]["black_box"]
    knee = box["knee"]
    runs = [(r["rate_rps"], r["kept_up"]) for r in knee["rates"]]
    # the knee is bracketed by measured rates: one kept up with, a higher one not (the lowest rate missed is run
    # twice, and the repeat may keep up)
    assert knee["measured_knee_rps"] is not None and knee["missed_rps"] is not None, knee
    assert (knee["measured_knee_rps"], True) in runs and (knee["missed_rps"], False) in runs, runs
    assert knee["measured_knee_rps"] < knee["missed_rps"]
    lines = profiled.stdout.splitlines()
    assert [x for x in lines if x.startswith("knee: measured between")], profiled.stdout
    # prompt lengths are exact (the GGUF's own tokenizer): TTFT grows with them, fitted at every length
    assert len(box["ttft_points"]) == 5 and box["ttft_median_rel_error"] < 0.25, box["ttft_points"]
    names = {p["name"] for p in box["process_memory"]["processes"]}
    assert "llama-server" in names, names

    planned = _gate(["plan", "--requests", "40", "--verify", "--json", "plan.json"], tmp_path, binary)
    assert planned.returncode == 0, planned.stderr[-3000:]
    data = json.loads((tmp_path / "plan.json").read_text())
    claimed = data["per_replica"]["rate_rps"]
    assert data["per_replica"]["high_rps"] > data["per_replica"]["low_rps"]
    assert data["knee"]["kept_up_rps"] == knee["measured_knee_rps"] and not data["knee"]["extrapolated"]
    points = {p["point"]: p for p in data["verify"]["points"]}
    assert points["claimed capacity"]["rate_rps"] == pytest.approx(claimed)
    assert points["past the claim"]["rate_rps"] > claimed
    assert all(p["measured_requests_per_s"] > 0 for p in points.values())
    memory = data["memory"]
    assert memory["modelled"] and "measured by `gate profile`" in memory["runtime_overhead_source"]
    print(
        f"\nprofile {profile_s:.0f} s, plan + verify {time.monotonic() - began - profile_s:.0f} s; knee "
        f"{knee['measured_knee_rps']:.3g}-{knee['missed_rps']:.3g} requests/s (predicted "
        f"{knee['predicted_capacity_rps']:.3g}); per replica {claimed:.3g} ({data['per_replica']['low_rps']:.3g}-"
        f"{data['per_replica']['high_rps']:.3g}); memory planned {memory['total_bytes'] / 2**20:.0f} MiB"
    )
    for p in points.values():
        print(f"{p['point']}: {p['measured_requests_per_s']:.3g} requests/s measured vs "
              f"{p['predicted_requests_per_s']:.3g} predicted")  # fmt: skip
