"""`gate profile` and `gate plan` of an endpoint manifest from the command line."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from capacity_helpers import STEP_MODEL
from support.step_cost_server import StepCosts, StepCostServer
from test_capacity_cli import gate

from servegate.capacity.latency.prediction import profile_key
from servegate.capacity.latency.provenance import Provenance, hardware_id, profile_path
from servegate.contracts.loading import load_manifest


def write_endpoint(tmp_path: Path, model_dir: Path, url: str, extra: str = "") -> Path:
    path = tmp_path / "remote.yaml"
    path.write_text(
        f"name: remote\nweights: {{source: {model_dir}}}\n"
        f"runtime: {{backend: endpoint, endpoint_url: '{url}', max_model_len: 128}}\n"
        "preprocess: {max_input_tokens: 64}\npostprocess: {max_output_tokens: 32}\n"
        "batching: {mode: continuous, max_batch_size: 4, max_num_batched_tokens: 256}\n"
        "capacity:\n  workload: {input_tokens: {mean: 32, max: 32}, output_tokens: {mean: 8, max: 8},"
        " rate_rps: 5, num_requests: 40}\n"
        "  targets: {e2e_ms: {p99: 400}}\n" + extra
    )
    return path


def test_plan_an_endpoint_prints_every_candidate_the_rate_per_replica_and_replicas(
    tmp_path: Path, model_dir: Path
) -> None:
    path = write_endpoint(tmp_path, model_dir, "http://10.0.0.5:8000/v1", "  total_rate_rps: 30\n")
    key = profile_key(load_manifest(path))
    model = replace(STEP_MODEL, provenance=Provenance(key=key, hardware=hardware_id()))
    model.save(profile_path(key, hardware_id(), tmp_path / "home" / "profiles"))
    done = gate("plan", str(path), "--requests", "40", "--json", "plan.json", cwd=tmp_path, home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "plan.json").read_text())
    assert len(data["candidates"]) == 15 and data["candidates"][0]["verdict"] == "recommended"
    assert "candidate policies (15 tried)" in done.stdout and "recommended" in done.stdout
    per = data["per_replica"]
    assert data["replicas"]["replicas"] == math.ceil(30 / per["rate_rps"])
    assert data["replicas"]["source"] == "capacity.total_rate_rps"
    assert f"replicas: {data['replicas']['replicas']} for 30 requests/s" in done.stdout
    assert "per replica:" in done.stdout
    # off a terminal (#40): one line per candidate, the columns named, nothing drawn or wrapped
    rows = [x for x in done.stdout.splitlines() if x.startswith("continuous b=") and "| verdict: " in x]
    assert len(rows) == 15 and all("| E2E p99: " in x and "| max rate: " in x for x in rows)
    [per_replica] = [x for x in done.stdout.splitlines() if x.startswith("per replica:")]
    assert "90% interval" in per_replica and per_replica.endswith("requests/s")
    assert not any(c in done.stdout for c in "┃│┏")


def test_the_total_rate_comes_from_the_trace_then_the_flag_then_the_manifest(tmp_path: Path, model_dir: Path) -> None:
    from servegate.cli.plan import _total_rate

    served = load_manifest(write_endpoint(tmp_path, model_dir, "http://h/v1", "  total_rate_rps: 30\n"))
    trace = tmp_path / "a.txt"
    trace.write_text("\n".join(str(i / 10) for i in range(21)))  # 10 requests/s for 2 s
    assert _total_rate(served, None, None, 60.0) == (30.0, "capacity.total_rate_rps")
    assert _total_rate(served, 3.0, None, 60.0) == (3.0, "--total-rate")
    rate, source = _total_rate(served, 3.0, trace, 1.0)
    assert rate == pytest.approx(11.0) and source.startswith("the peak of a.txt over 1 s windows (21 arrivals)")


@pytest.mark.slow
def test_gate_profile_measures_an_endpoint_from_outside(tmp_path: Path, model_dir: Path) -> None:
    costs = StepCosts(step_s=0.008, prefill_token_s=0.0003, decode_seq_s=0.002, max_batch_size=4)
    with StepCostServer(costs) as server:
        path = write_endpoint(tmp_path, model_dir, server.url)
        done = gate("profile", str(path), "--repeats", "2", "--json", "profile.json", cwd=tmp_path,
                    home=tmp_path / "home")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "profiled from outside (endpoint" in done.stdout
    [knee] = [x for x in done.stdout.splitlines() if x.startswith("knee: ")]  # one line, however long
    assert "knee: measured between" in knee or "is an extrapolation" in knee
    data = json.loads((tmp_path / "profile.json").read_text())
    assert data["steps"]["c_step"] == pytest.approx(0.008, rel=0.1)
    assert data["fit"]["black_box"]["knee"]["rates"]
    knee, stream = data["fit"]["black_box"]["knee"], data["fit"]["black_box"]["stream"]
    if knee["measured_capacity_rps"]:  # the steady stream runs once the capacity is measured
        assert stream["rate_rps"] <= 0.7 * knee["measured_capacity_rps"] + 1e-9 and stream["requests"] >= 20
        assert [x for x in done.stdout.splitlines() if x.startswith("steady stream: ")]
