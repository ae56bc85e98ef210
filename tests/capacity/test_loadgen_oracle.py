"""MLPerf LoadGen as the oracle of servegate's conservative percentiles (`make loadgen-venv` first; slow).

`gate bench --records` writes the latencies it measured; LoadGen replays them (tests/capacity/loadgen_replay.py,
in its own venv) and reports its early-stopping estimate. LoadGen times the replay itself, so its latencies
are the recorded ones plus the replay's lateness: the rank it picks (how many highest queries it discards)
must equal servegate's exactly, and the value must match to within the lateness the replay measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.synthetic_server import Delays, SyntheticServer
from typer.testing import CliRunner

from servegate.capacity.bench.percentiles import conservative_estimate, overlatency_allowed
from servegate.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
LOADGEN = ROOT / ".venvs" / "loadgen" / "bin" / "python"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not LOADGEN.exists(), reason="no LoadGen venv: run `make loadgen-venv`"),
]


def bench_latencies(tmp_path: Path, requests: int) -> np.ndarray:
    """End-to-end latencies (ms) that `gate bench --records` wrote against a server with known delays."""
    records = tmp_path / "records.jsonl"
    with SyntheticServer(Delays(ttft_ms=2, itl_ms=1)) as server:
        done = CliRunner().invoke(app, ["bench", "--url", server.url, "--rate", "150", "--requests", str(requests),
                                        "--records", str(records)])  # fmt: skip
    assert done.exit_code == 0, done.output
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) == requests and all(line["ok"] for line in lines)
    return np.array([line["e2el_ms"] for line in lines])


def loadgen(tmp_path: Path, latencies: np.ndarray, percentile: float) -> dict[str, Any]:
    spec = tmp_path / f"latencies-{percentile}.json"
    spec.write_text(json.dumps({"latencies_ms": latencies.tolist(), "percentile": percentile}))
    out = tmp_path / f"loadgen-{percentile}"
    out.mkdir()
    done = subprocess.run(
        [str(LOADGEN), str(ROOT / "tests/capacity/loadgen_replay.py"), str(spec), str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("q", [90, 99])
def test_servegates_conservative_percentile_is_loadgens(tmp_path: Path, q: int) -> None:
    latencies = bench_latencies(tmp_path, 700)
    ours = conservative_estimate(np.sort(latencies), q)
    t = overlatency_allowed(len(latencies), q)
    theirs = loadgen(tmp_path, latencies, q / 100)
    assert theirs["queries"] == 700 and not theirs["not_enough"]
    assert theirs["discarded"] == t - 1, theirs["summary"]
    assert ours is not None
    lg_ms = theirs["estimates_ns"][f"{q:.1f}"] / 1e6
    # LoadGen's latencies are the replayed ones plus the replay's lateness (>= 0, measured by the replay)
    assert ours - 0.05 <= lg_ms <= ours + theirs["max_late_ms"] + 0.5, (ours, lg_ms, theirs["max_late_ms"])
    print(f"p{q}: servegate {ours:.3f} ms, LoadGen {lg_ms:.3f} ms (replay late by up to "
          f"{theirs['max_late_ms']:.2f} ms), discarding {t - 1} of 700")  # fmt: skip


def test_below_the_floor_neither_gives_an_estimate(tmp_path: Path) -> None:
    latencies = bench_latencies(tmp_path, 63)
    assert conservative_estimate(np.sort(latencies), 90) is None
    theirs = loadgen(tmp_path, latencies, 0.9)
    assert theirs["not_enough"] and "at least 64 queries" in theirs["summary"]
    assert sys.executable  # servegate's own interpreter never imported LoadGen
