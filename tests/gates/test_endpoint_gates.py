"""Gates on an endpoint candidate measure the remote, or say they could not: no pass for what was not measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.fake_remote import FakeRemote, RemoteBehaviour, reference_answer
from support.servegate_remote import ServegateRemote

from servegate.capacity.bench.local_server import free_port
from servegate.contracts.manifest import ServedModel
from servegate.gates.check import run_check
from servegate.gates.suites.output_cache import OutputCache

SUITES = [
    {"name": "arith", "dataset": "zoo:arith", "limit": 80, "public": True},
    {"name": "recall", "dataset": "zoo:recall", "limit": 80, "public": True},
]
BASE: dict[str, Any] = {
    "name": "gated",
    "weights": {"source": "zoo:tiny-primary"},
    "preprocess": {"chat_template": "none", "max_input_tokens": 96},
    "runtime": {"max_model_len": 128},
    "postprocess": {"max_output_tokens": 32},
    "quality": {"suites": SUITES, "margins": {"exact_match": 0.05}},
}


def reference() -> ServedModel:
    return ServedModel.model_validate(BASE)


def candidate(url: str, **runtime: Any) -> ServedModel:
    """The same model behind an endpoint; `runtime` adds what the deployment declares of itself."""
    data = json.loads(json.dumps(BASE))
    data["runtime"].update(backend="endpoint", endpoint_url=url, endpoint_model="remote", **runtime)
    return ServedModel.model_validate(data)


def check(base: ServedModel, cand: ServedModel, *gates: str) -> Any:
    return run_check(base, cand, mode="change", forced=list(gates), cache=OutputCache(enabled=False))


@pytest.fixture(scope="module")
def same_model() -> Any:
    """A remote that serves zoo:tiny-primary exactly as servegate's reference runtime does."""
    with FakeRemote(RemoteBehaviour(answer=reference_answer(BASE))) as remote:
        yield remote


def test_the_quality_gate_runs_on_the_remote_and_passes_when_it_answers_like_the_reference(same_model: Any) -> None:
    report = check(reference(), candidate(same_model.url), "quality")
    [quality] = [g for g in report.gates if g.name == "quality"]
    assert quality.verdict == "pass", quality.reason
    assert "vllm 0.32.0 serving remote" in quality.measurements.ran_on
    assert len(same_model.bodies) >= 160  # every suite item went to the remote
    assert report.candidate.remote.engine == "vllm"


def test_a_remote_that_answers_differently_fails_quantization_and_truncation_gates() -> None:
    """The issue's false pass: both gates used to run servegate's own runtime instead of the remote."""
    with FakeRemote(RemoteBehaviour(answer=lambda ids, n: "0")) as remote:
        declared = candidate(remote.url, quantization={"method": "int8-weight"})
        data = declared.model_dump(mode="python")
        data["preprocess"].update(max_input_tokens=64, truncation="left")
        report = check(reference(), ServedModel.model_validate(data), "quantization", "truncation")
    verdicts = {g.name: g.verdict for g in report.gates if g.verdict != "skipped"}
    assert verdicts == {"quantization": "fail", "truncation": "fail"}
    assert report.verdict == "fail"


def test_an_honest_endpoint_in_front_of_servegate_passes_the_batching_and_truncation_gates() -> None:
    """The issue: servegate's own server sends no token ids, and both gates counted every equal text as changed."""
    remote = json.loads(json.dumps(BASE))
    remote["name"] = "remote"  # the model id it lists, the candidate's endpoint_model
    remote["postprocess"]["logprobs"] = True
    with ServegateRemote(remote) as running:
        report = check(reference(), candidate(running.url), "batching", "truncation")
    ran = {g.name: g for g in report.gates if g.verdict != "skipped"}
    assert {name: g.verdict for name, g in ran.items()} == {"batching": "pass", "truncation": "pass"}, [
        g.reason for g in ran.values()
    ]
    assert ran["batching"].measurements.mismatches == 0
    assert ran["batching"].measurements.token_source == ran["truncation"].measurements.token_source == "logprobs"
    assert "servegate" in ran["batching"].measurements.ran_on


def test_an_endpoint_whose_remote_names_no_tokens_is_compared_by_its_text() -> None:
    """No logprobs offered: the tokens are the text re-tokenized (no EOS), so the text decides, and says so."""
    remote = json.loads(json.dumps(BASE))
    remote["name"] = "remote"
    with ServegateRemote(remote) as running:  # postprocess.logprobs is off: it refuses logprobs
        report = check(reference(), candidate(running.url), "batching")
    [batching] = [g for g in report.gates if g.name == "batching"]
    assert batching.verdict == "pass", batching.reason
    assert batching.measurements.token_source == "tokenizer" and "candidate tokens: tokenizer" in batching.reason


def test_an_unreachable_remote_is_unavailable_not_inferior() -> None:
    report = check(reference(), candidate(f"http://127.0.0.1:{free_port()}/v1"), "quality", "contract")
    ran = [g for g in report.gates if g.verdict != "skipped"]
    assert {g.verdict for g in ran} == {"unavailable"} and len(ran) == 2
    assert "cannot be reached" in ran[0].reason
    assert report.verdict == "unavailable"


def test_a_remote_that_fails_its_requests_is_unavailable() -> None:
    with FakeRemote(RemoteBehaviour(status=503)) as remote:
        report = check(reference(), candidate(remote.url), "quality")
    [quality] = [g for g in report.gates if g.name == "quality"]
    assert quality.verdict == "unavailable" and "ended model_unavailable" in quality.reason


def test_the_fingerprint_follows_the_engine_not_the_port() -> None:
    small = json.loads(json.dumps(BASE))
    small["quality"]["suites"] = [{"name": "arith", "dataset": "zoo:arith", "limit": 4}]

    def recorded(behaviour: RemoteBehaviour) -> str:
        with FakeRemote(behaviour) as remote:
            data = {**small, "runtime": {**small["runtime"], "backend": "endpoint", "endpoint_url": remote.url,
                                         "endpoint_model": "remote"}}  # fmt: skip
            base = ServedModel.model_validate(small)
            return str(check(base, ServedModel.model_validate(data), "quality").candidate.fingerprint)

    one, other_port = recorded(RemoteBehaviour()), recorded(RemoteBehaviour())
    newer = recorded(RemoteBehaviour(version="0.33.0"))
    assert one == other_port
    assert newer != one


def test_a_declared_engine_version_the_remote_does_not_report_fails_the_contract_gate() -> None:
    with FakeRemote(RemoteBehaviour(version="0.32.0")) as remote:
        cand = candidate(remote.url, engine={"name": "vllm", "version": "0.31.1"})
        report = check(reference(), cand, "contract")
    [contract] = [g for g in report.gates if g.name == "contract"]
    assert contract.verdict == "fail" and "0.31.1" in contract.reason and "0.32.0" in contract.reason


def capacity_candidate(url: str, memory: str) -> ServedModel:
    data = candidate(url).model_dump(mode="python")
    data["capacity"] = {
        "workload": {"input_tokens": {"mean": 8}, "output_tokens": {"mean": 4}, "arrival": "poisson",
                     "rate_rps": 40, "num_requests": 12},
        "targets": {"e2e_ms": {"p50": 5000}, "memory": memory},
    }  # fmt: skip
    return ServedModel.model_validate(data)


def test_memory_of_a_vllm_remote_is_not_checked_and_the_gate_says_why() -> None:
    with FakeRemote(RemoteBehaviour(engine="vllm", resident_bytes=400 * 2**20)) as remote:
        report = check(reference(), capacity_candidate(remote.url, "128MiB"), "capacity")
    [capacity] = [g for g in report.gates if g.name == "capacity"]
    assert capacity.verdict == "warn"
    assert "memory target not checked" in capacity.reason and "API process only" in capacity.reason
    assert all(t["name"] != "memory" for t in capacity.measurements.targets)


def test_memory_a_servegate_remote_reports_is_checked() -> None:
    with FakeRemote(RemoteBehaviour(engine="servegate", resident_bytes=400 * 2**20)) as remote:
        over = check(reference(), capacity_candidate(remote.url, "128MiB"), "capacity")
        under = check(reference(), capacity_candidate(remote.url, "1GiB"), "capacity")
    verdicts = [next(g for g in r.gates if g.name == "capacity").verdict for r in (over, under)]
    assert verdicts == ["fail", "pass"]


def gate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servegate.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)  # fmt: skip


def test_gate_eval_and_gate_check_exit_2_when_the_remote_is_down(tmp_path: Path) -> None:
    dead = candidate(f"http://127.0.0.1:{free_port()}/v1").model_dump(mode="json")
    (tmp_path / "remote.yaml").write_text(json.dumps(dead))
    (tmp_path / "ref.yaml").write_text(json.dumps(reference().model_dump(mode="json")))
    evaluated = gate("eval", "remote.yaml", cwd=tmp_path)
    assert evaluated.returncode == 2, evaluated.stdout + evaluated.stderr
    assert "cannot be reached" in evaluated.stderr and "0.0000" not in evaluated.stdout
    checked = gate("check", "--baseline", "ref.yaml", "--candidate", "remote.yaml", "--gate", "quality",
                   "--json", "out.json", "--no-cache", cwd=tmp_path)  # fmt: skip
    assert checked.returncode == 2, checked.stdout + checked.stderr
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["verdict"] == "unavailable"


def test_gate_validate_says_what_is_enforced_here_and_what_only_describes_the_remote(tmp_path: Path) -> None:
    declared = candidate("http://127.0.0.1:9/v1", quantization={"method": "int8-weight"})
    (tmp_path / "remote.yaml").write_text(json.dumps(declared.model_dump(mode="json")))
    done = gate("validate", "remote.yaml", "--json", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    scope = json.loads(done.stdout)["remote_scope"]
    assert scope["declared_not_verified"]["runtime.quantization"]["method"] == "int8-weight"
    assert "preprocess" in scope["enforced_in_front"]
    assert "declared by the remote, not verified" in done.stderr


QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def test_an_honest_endpoint_in_front_of_gate_serve_passes_caching_fallback_and_capacity(tmp_path: Path) -> None:
    """The issue's last warnings: the remote's prefix hits (its usage), its overload (a burst past every slot the
    endpoint admits) and its memory (its /metrics) were invisible, so three gates warned on an honest remote."""
    import shutil

    import yaml
    from support.servers import start_gate_serve

    shutil.copy(QUICKSTART / "fallback.yaml", tmp_path / "fallback.yaml")
    remote = yaml.safe_load((QUICKSTART / "manifest.yaml").read_text())
    remote["preprocess"]["tenant_from"] = "none"
    remote["runtime"]["quantization"] = {"method": "none"}
    remote["postprocess"]["response_cache"]["enabled"] = False
    # the json suite stays whole: the fallback's output contract needs its 200 items to decide a 0.02 margin
    suites = remote["quality"]["suites"]
    remote["quality"]["suites"] = [{**s, "limit": 40} if s["name"] != "json" else s for s in suites]
    remote["capacity"]["workload"]["num_requests"] = 24
    remote["capacity"]["targets"] = {"e2e_ms": {"p50": 5000}, "memory": "4GiB"}
    server = start_gate_serve(tmp_path, remote)
    try:
        server.wait_ready()
        body = {"model": "quickstart", "prompt": "12+34=12+34=12+34=12+34=", "max_tokens": 2}
        usages = [httpx.post(server.url("/v1/completions"), json=body, timeout=30).json()["usage"] for _ in "ab"]
        assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [0, 16]  # one block, then a hit
        endpoint = json.loads(json.dumps(remote))
        endpoint["runtime"].update(backend="endpoint", endpoint_url=server.url("/v1"), endpoint_model="quickstart")
        (tmp_path / "endpoint.json").write_text(json.dumps(endpoint))
        done = gate("check", "endpoint.json", "--gate", "caching", "--gate", "fallback", "--gate", "capacity",
                    "--json", "out.json", "--no-cache", cwd=tmp_path)  # fmt: skip
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    gates = {g["name"]: g for g in json.loads((tmp_path / "out.json").read_text())["gates"]}
    assert {n: gates[n]["verdict"] for n in ("caching", "fallback", "capacity")} == dict.fromkeys(
        ("caching", "fallback", "capacity"), "pass"
    ), [gates[n]["reason"] for n in ("caching", "fallback", "capacity")]
    caching = gates["caching"]["measurements"]
    assert caching["warm_prefix_hits"] > 0 and caching["stale_hits_after_fingerprint_change"] == 0
    overload = gates["fallback"]["measurements"]["routing"]["overload"]
    assert overload["sent"] == 32 + 1 + 16 and overload["routed_to_fallback"] > 0
    assert any(t["name"] == "memory" for t in gates["capacity"]["measurements"]["targets"])
