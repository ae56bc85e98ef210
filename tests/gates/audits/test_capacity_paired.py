"""The capacity gate on a change: baseline and candidate benched interleaved, gated on their ratio, beside a CPU hog."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.synthetic_server import Delays, SyntheticServer

from servegate.capacity.bench.interleaved import Ratio
from servegate.contracts.manifest import ServedModel
from servegate.gates.audits.capacity_paired import RatioCheck
from servegate.gates.base import GateContext
from servegate.gates.registry import GATES

HOG = "import time\nend = time.time() + 60\nwhile time.time() < end:\n    pass\n"
"""Spins one core for at most 60 s (killed when the test ends)."""


@pytest.fixture
def cpu_hog() -> Iterator[subprocess.Popen[bytes]]:
    """A background process spinning one core for the length of the test."""
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        yield hog
    finally:
        hog.kill()
        hog.wait(10)


@pytest.fixture
def gate() -> Any:
    importlib.import_module("servegate.gates.check")
    return GATES.entry("capacity").obj()


def endpoint(url: str, **capacity: Any) -> ServedModel:
    load = {"input_tokens": {"mean": 8, "max": 8}, "output_tokens": {"mean": 4, "max": 4}, "rate_rps": 40,
            "num_requests": 40}  # fmt: skip
    return ServedModel.model_validate(
        {
            "name": "remote",
            "weights": {"source": "zoo:tiny-primary"},
            "runtime": {"backend": "endpoint", "endpoint_url": url},
            "capacity": {"workload": load, "targets": {"e2e_ms": {"p50": 2000}}, **capacity},
        }
    )


def change(gate: Any, base: SyntheticServer, cand: SyntheticServer, **capacity: Any) -> Any:
    ctx = GateContext(endpoint(base.url, **capacity), endpoint(cand.url, **capacity), mode="change")
    return gate.run(ctx)


def test_both_sides_get_the_same_prompts_in_the_same_order_in_alternating_rounds(gate: Any) -> None:
    with SyntheticServer(Delays(ttft_ms=5, itl_ms=2)) as base, SyntheticServer(Delays(ttft_ms=5, itl_ms=2)) as cand:
        result = change(gate, base, cand)
        seen_base, seen_cand = base.prompts[1:], cand.prompts[1:]  # after each side's probe
    assert result.measurements.paired is True
    assert len(seen_base) == 40 and seen_base == seen_cand
    assert len(set(seen_base)) == 40  # fresh text per request: no cache answers a repeat
    ratio = next(t for t in result.measurements.targets if t.get("kind") == "ratio")
    assert ratio["name"] == "e2e_ms.p50" and ratio["low"] <= ratio["ratio"] <= ratio["high"]


def test_a_change_that_changes_nothing_does_not_fail_beside_a_cpu_hog(gate: Any, cpu_hog: Any) -> None:
    same = Delays(ttft_ms=20, itl_ms=5)
    with SyntheticServer(same) as base, SyntheticServer(same) as cand:
        result = change(gate, base, cand, targets={"e2e_ms": {"p50": 2000}, "throughput": {"value": 5}})
    assert cpu_hog.poll() is None  # the hog spun throughout
    assert result.verdict != "fail", result.reason
    ratios = {t["name"]: t for t in result.measurements.targets if t.get("kind") == "ratio"}
    assert set(ratios) == {"e2e_ms.p50", "throughput.requests/s"}
    assert 0.8 < ratios["e2e_ms.p50"]["ratio"] < 1.2


def test_a_planted_regression_fails_beside_a_cpu_hog(gate: Any, cpu_hog: Any) -> None:
    """One request at a time (batch size 1) against 32 at a load one slot cannot carry: caught, hog or not."""
    with (
        SyntheticServer(Delays(ttft_ms=20, itl_ms=5, slots=32)) as base,
        SyntheticServer(Delays(ttft_ms=20, itl_ms=5, slots=1)) as cand,
    ):
        result = change(gate, base, cand)
    assert cpu_hog.poll() is None
    assert result.verdict == "fail", result.reason
    assert "e2e_ms.p50 candidate/baseline" in result.reason and "worse beyond the tolerance" in result.reason
    ratio = next(t for t in result.measurements.targets if t.get("kind") == "ratio")
    assert ratio["low"] > 1.1 and ratio["tolerance"] == 0.10


@pytest.mark.parametrize(
    ("low", "high", "higher", "verdict"),
    [
        (0.95, 1.08, False, "pass"),
        (1.12, 1.5, False, "fail"),
        (0.95, 1.3, False, "warn"),
        (0.92, 1.1, True, "pass"),
        (0.5, 0.85, True, "fail"),
        (0.8, 1.0, True, "warn"),
    ],
)
def test_the_ratio_verdict_reads_the_whole_interval_against_the_tolerance(
    low: float, high: float, higher: bool, verdict: str
) -> None:
    check = RatioCheck("m", Ratio(1.0, 1.0, (low + high) / 2, low, high, 0.95), 0.10, higher)
    assert check.verdict == verdict
    assert ("inconclusive" in check.sentence()) == (verdict == "warn")


def test_a_target_the_baseline_misses_too_on_this_machine_is_a_warning_not_a_failure(gate: Any) -> None:
    """Both sides over a 30 ms budget at the same moments: the machine (here, the server) misses it, not the change."""
    slow = Delays(ttft_ms=60, itl_ms=5)
    with SyntheticServer(slow) as base, SyntheticServer(slow) as cand:
        result = change(gate, base, cand, targets={"e2e_ms": {"p50": 30}})
    assert result.verdict == "warn", result.reason
    assert "e2e_ms.p50" in result.reason and "the baseline misses it too" in result.reason
    absolute = next(t for t in result.measurements.targets if t.get("kind") != "ratio")
    assert absolute["baseline_misses_too"] is True and absolute["over"] == 40


QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart" / "manifest.yaml"


@pytest.mark.slow
def test_the_quickstart_gated_against_itself_beside_a_cpu_hog(gate: Any, cpu_hog: Any) -> None:
    """The quickstart's own servers, interleaved: a harmless change does not fail, batch size 1 against 32 does."""
    from servegate.cli.common import load

    base = load(QUICKSTART, None)
    harmless = load(QUICKSTART, ["batching.max_wait_ms=4"])
    one_at_a_time = load(QUICKSTART, ["batching.max_batch_size=1"])
    safe = gate.run(GateContext(base, harmless, mode="change"))
    planted = gate.run(GateContext(base, one_at_a_time, mode="change"))
    assert safe.verdict != "fail", safe.reason
    assert planted.verdict == "fail", planted.reason
    failed = [t for t in planted.measurements.targets if t.get("kind") == "ratio" and t["verdict"] == "fail"]
    assert failed, planted.measurements.targets


def test_gate_check_on_a_change_exits_1_for_the_regression_and_0_for_the_harmless_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from servegate.cli.app import app

    monkeypatch.chdir(tmp_path)  # the baseline cache is written beside the command

    def manifest(name: str, url: str) -> Path:
        path = tmp_path / name
        path.write_text(
            f'name: remote\nweights: {{source: "zoo:tiny-primary"}}\n'
            f'runtime: {{backend: endpoint, endpoint_url: "{url}"}}\n'
            "capacity:\n  workload: {input_tokens: {mean: 8, max: 8}, output_tokens: {mean: 4, max: 4}, rate_rps: 40, "
            "num_requests: 40}\n  targets: {e2e_ms: {p50: 2000}}\n"
        )
        return path

    codes = {}
    for slots in (32, 1):
        with (
            SyntheticServer(Delays(ttft_ms=20, itl_ms=5, slots=32)) as base,
            SyntheticServer(Delays(ttft_ms=20, itl_ms=5, slots=slots)) as cand,
        ):
            pair = ["--baseline", str(manifest("a.yaml", base.url)), "--candidate", str(manifest("b.yaml", cand.url))]
            args = ["check", *pair, "--gate", "capacity", "--json", str(tmp_path / "r.json")]
            done = CliRunner().invoke(app, args)
        capacity = next(g for g in json.loads((tmp_path / "r.json").read_text())["gates"] if g["name"] == "capacity")
        codes[slots] = (done.exit_code, capacity["verdict"], capacity["measurements"]["paired"])
    assert codes[1] == (1, "fail", True), codes
    assert codes[32][0] == 0 and codes[32][1] in ("pass", "warn"), codes
