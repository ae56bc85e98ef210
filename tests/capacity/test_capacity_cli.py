"""`gate plan`, `gate bench` from the command line: outputs, files and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from capacity_helpers import STEP_MODEL, TINY_LLAMA
from support.synthetic_server import Delays, SyntheticServer

from servegate.capacity.latency.prediction import profile_key
from servegate.capacity.latency.provenance import Provenance, hardware_id

LLAMA2_7B = {**TINY_LLAMA, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32}  # fmt: skip


def gate(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servegate.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80", "SERVEGATE_HOME": str(home)},  # a CI log's width: nothing may wrap
        timeout=300,
    )


def test_memory_only_plan_and_its_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA2_7B))
    args = ("plan", "--model-config", str(config), "--memory-budget", "80GiB", "--context", "4096")
    done = gate(*args, "--runtime-overhead", "2GiB", "--json", "-", cwd=tmp_path, home=tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["kv_bytes_per_token"], data["max_concurrent_sequences"]) == (524_288, 32)
    assert "max concurrent sequences at 4,096 tokens: 32" in done.stderr
    bad = gate("plan", "--model-config", str(config), cwd=tmp_path, home=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --model-config needs --memory-budget")


def test_a_model_whose_weights_exceed_the_budget_is_an_infeasible_plan(tmp_path: Path) -> None:
    """Exit 1 (a result, as a failed gate), not 2 (a usage error), with the JSON written as for a feasible plan."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA2_7B))
    args = ("plan", "--model-config", str(config), "--memory-budget", "8GiB", "--context", "4096")
    done = gate(*args, "--runtime-overhead", "1GiB", "--json", "plan.json", cwd=tmp_path, home=tmp_path)
    assert done.returncode == 1, done.stderr
    data = json.loads((tmp_path / "plan.json").read_text())
    assert (data["kv_bytes_per_token"], data["weights_bytes"], data["feasible"]) == (524_288, 2 * 6_738_415_616, False)
    assert data["shortfall_bytes"] == 2 * 6_738_415_616 + 2**30 + 4096 * 524_288 - 8 * 2**30
    said = " ".join(done.stdout.split())
    assert "infeasible: the memory budget 8.00 GiB does not hold the weights" in said and "GiB short" in said


def test_bench_a_url_writes_json_and_plots(tmp_path: Path) -> None:
    with SyntheticServer(Delays(ttft_ms=20, itl_ms=5)) as server:
        done = gate("bench", "--url", server.url, "--rate", "20", "--requests", "12", "--plots", "plots",
                    "--json", "bench.json", cwd=tmp_path, home=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["requests"]["completed"] == 12 and data["ttft_ms"]["p50"] >= 20
    assert "TPOT" in data["definitions"] and "scheduled send time" in data["definitions"]["TTFT"]
    assert "TTFT: time to first token" in done.stdout
    # off a terminal (#40): one line per metric with its columns, no drawn table, no line wrapped
    [ttft] = [x for x in done.stdout.splitlines() if x.startswith("TTFT | ")]
    assert "| p50: " in ttft and "| p99: " in ttft and "| count: 12" in ttft
    assert not any(c in done.stdout for c in "┃│┏")
    assert (tmp_path / "plots/latency_cdf.png").is_file() and (tmp_path / "plots/rate_curves.png").is_file()
    none = gate("bench", cwd=tmp_path, home=tmp_path)
    assert none.returncode == 2 and "--url" in none.stderr


def test_plan_a_manifest_with_a_saved_profile_and_write_it_back(tmp_path: Path, model_dir: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "# sized for the demo\nname: tiny\n"
        f"weights: {{source: {model_dir}}}\n"
        "preprocess: {max_input_tokens: 64}\npostprocess: {max_output_tokens: 32}\n"
        "runtime:\n  device: cpu\n  dtype: float32\n  max_model_len: 128\n"
        "  kv_cache: {block_size: 16, memory_budget: 4MiB}\n"
        "batching:\n  mode: none   # to be planned\n"
        "capacity:\n  workload: {input_tokens: {mean: 32, max: 32}, output_tokens: {mean: 8, max: 8},"
        " rate_rps: 2, num_requests: 60}\n"
        "  targets: {e2e_ms: {p99: 1000}}\n"
    )
    missing = gate("plan", str(path), cwd=tmp_path, home=tmp_path / "home")
    assert missing.returncode == 2 and "run `gate profile`" in missing.stderr
    assert "or `gate plan --profile` to profile and then plan (profiling takes minutes: 623 s" in missing.stderr
    from servegate.capacity.latency.provenance import profile_path
    from servegate.contracts.loading import load_manifest

    key = profile_key(load_manifest(path))
    saved = profile_path(key, hardware_id(), tmp_path / "home" / "profiles")
    saved.parent.mkdir(parents=True)
    saved.write_text(json.dumps({"coefficients": {"c_step": 0.005}, "request_overhead_s": 0.002, "key": key}))
    old = gate("plan", str(path), cwd=tmp_path, home=tmp_path / "home")  # a profile of the format before the parts
    assert old.returncode == 2 and "latency profile of format 1" in old.stderr and "run `gate profile`" in old.stderr
    model = replace(STEP_MODEL, provenance=Provenance(key=key, hardware=hardware_id()))
    model.save(saved)
    done = gate("plan", str(path), "--requests", "60", "--write", "--json", "plan.json", cwd=tmp_path,
                home=tmp_path / "home")  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["regime"] == "latency-bound" and data["feasible"]
    assert "regime: latency-bound" in done.stdout
    assert "# sized for the demo" in path.read_text()
    assert load_manifest(path).batching.model_dump(mode="json") == data["recommended"]["batching"]
    # 64 input + 32 output tokens is the longest request the contract accepts
    assert data["recommended"]["max_model_len"] == 96 and load_manifest(path).runtime.max_model_len == 96
    assert "runtime.max_model_len" in done.stdout


def test_plan_verify_benches_the_plan_after_a_speed_check(tmp_path: Path) -> None:
    from servegate.capacity.bench.machine_speed import MachineSpeed
    from servegate.capacity.latency.provenance import FitQuality, LoneReference, profile_path
    from servegate.contracts.loading import load_manifest

    path = tmp_path / "m.yaml"
    path.write_text(
        "name: tiny\nweights: {source: 'zoo:tiny-primary'}\n"
        "preprocess: {max_input_tokens: 64, chat_template: none}\npostprocess: {max_output_tokens: 32}\n"
        "runtime:\n  device: cpu\n  dtype: float32\n  max_model_len: 128\n  threads: 1\n"
        "  kv_cache: {block_size: 16, memory_budget: 4MiB}\n"
        "batching: {mode: none}\n"
        "capacity:\n  workload: {input_tokens: {mean: 16, max: 16}, output_tokens: {mean: 4, max: 4},"
        " rate_rps: 20, num_requests: 12}\n"
    )
    provenance = Provenance(key=profile_key(load_manifest(path)), hardware=hardware_id(),
                            profiled_at="2026-12-01T03:17:24+0000")  # fmt: skip
    fit = FitQuality(
        lone_reference=LoneReference(requests=8, measured_e2el_p50_ms=9.0, predicted_e2el_p50_ms=10.0),
        machine_speed=MachineSpeed(250.0, {0: 250.0}, 240.0, 260.0, samples=80, seconds=4.0),
    )
    model = replace(STEP_MODEL, provenance=provenance, fit=fit)
    model.save(profile_path(provenance.key, provenance.hardware, tmp_path / "home" / "profiles"))
    done = gate("plan", str(path), "--requests", "40", "--verify", "--json", "plan.json", cwd=tmp_path,
                home=tmp_path / "home")  # fmt: skip
    assert done.returncode == 0, done.stderr
    check = json.loads((tmp_path / "plan.json").read_text())["verify"]["speed_check"]
    assert check["requests"] == 8 and check["measured_e2el_p50_ms"] > 0 and check["predicted_e2el_p50_ms"] > 0
    assert check["profile_lone_bias"] == 0.9
    expected = check["predicted_e2el_p50_ms"] * 0.9
    assert check["measured_over_expected"] == pytest.approx(check["measured_e2el_p50_ms"] / expected)
    assert check["profiled_at"] == "2026-12-01T03:17:24+0000"
    said = " ".join(done.stdout.split())
    assert "speed check: 8 lone requests took" in said and "expected from the profile of 2026-12-01T03:17:24" in said
    assert ("gate profile` again" in said) == check["drifted"]
    assert "predicted vs measured" in said
    machine = json.loads((tmp_path / "plan.json").read_text())["verify"]["machine_speed"]
    assert machine["profile_probe_us"] == 250.0 and machine["bench_probe_us"] > 0
    assert machine["bench_over_profile"] == pytest.approx(machine["bench_probe_us"] / 250.0)
    assert "machine: a Python loop took" in said and "us while profiling" in said
    # #40: benched at the operating point, the claimed per-replica rate and past it, each after a speed check;
    # off a terminal the table is one line per row
    verify = json.loads((tmp_path / "plan.json").read_text())["verify"]
    claimed = json.loads((tmp_path / "plan.json").read_text())["per_replica"]["rate_rps"]
    assert [p["point"] for p in verify["points"]] == ["operating point", "claimed capacity", "past the claim"]
    assert [p["rate_rps"] for p in verify["points"]] == pytest.approx([20, claimed, 1.2 * claimed])
    assert len(verify["speed_checks"]) == 3 and all(c["measured_e2el_p50_ms"] > 0 for c in verify["speed_checks"])
    for point in verify["points"]:
        for row in point["comparison"]:
            assert row["low"] <= row["predicted"] <= row["high"] and row["inside"] == (
                row["low"] <= row["measured"] <= row["high"])  # fmt: skip
    lines = done.stdout.splitlines()
    [claim_row] = [x for x in lines if x.startswith("claimed capacity") and "| metric: e2el p99 |" in x]
    assert "| interval: " in claim_row and "| measured: " in claim_row and "| verdict: " in claim_row
    assert not any(c in done.stdout for c in "┃│┏")


def test_plan_profile_profiles_first_and_plans_with_what_it_measured(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--profile` runs `gate profile`'s own step (measured: 623 s on the quickstart, so replaced here), then plans."""
    from typer.testing import CliRunner

    from servegate.capacity.latency.provenance import profile_path
    from servegate.cli import profile as profile_cli
    from servegate.cli.app import app

    path = tmp_path / "m.yaml"
    path.write_text(
        f"name: tiny\nweights: {{source: {model_dir}}}\n"
        "preprocess: {max_input_tokens: 64}\npostprocess: {max_output_tokens: 32}\n"
        "runtime:\n  device: cpu\n  dtype: float32\n  max_model_len: 128\n"
        "  kv_cache: {block_size: 16, memory_budget: 4MiB}\nbatching:\n  mode: none\n"
        "capacity:\n  workload: {input_tokens: {mean: 32, max: 32}, output_tokens: {mean: 8, max: 8},"
        " rate_rps: 2, num_requests: 60}\n  targets: {e2e_ms: {p99: 1000}}\n"
    )
    profiled: list[str] = []

    def profile_and_save(served: Any, console: Any, repeats: int = 5, burst: int = 8) -> tuple[Any, Path]:
        profiled.append(served.name)
        model = replace(STEP_MODEL, provenance=Provenance(key=profile_key(served), hardware=hardware_id()))
        return model, model.save(profile_path(profile_key(served), hardware_id(), tmp_path / "home" / "profiles"))

    monkeypatch.setattr(profile_cli, "profile_and_save", profile_and_save)
    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path / "home"))
    done = CliRunner().invoke(
        app, ["plan", str(path), "--profile", "--requests", "60", "--json", str(tmp_path / "p.json")]
    )
    assert done.exit_code == 0, done.output
    assert profiled == ["tiny"]
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["feasible"] and data["latency_model"]["coefficients_s"]["c_step"] == 0.005
