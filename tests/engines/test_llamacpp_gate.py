"""llama.cpp gated: `gate check` of a llamacpp manifest against the GGUF's parent on servegate's runtime, and the
export round trip (llama-server started from `gate export --target llamacpp` alone, verified and gated)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from llamacpp_support import gguf_pair, llama_server_binary, llamacpp_manifest_text
from support.manifests import manifest_file

from servegate.deploy.llamacpp_export import SCRIPT
from servegate.deploy.targets import export_manifest, write_export
from servegate.deploy.verify import verify_deployment
from servegate.gates.check import run_check
from servegate.gates.suites.output_cache import OutputCache
from servegate.runtime.remote.llamacpp_process import LlamaCppLaunchError
from servegate.runtime.remote.server_process import free_port

pytestmark = pytest.mark.engines

QUALITY = """
quality:
  suites:
    - {name: facts, dataset: "zoo:facts", kind: chat, limit: 64, max_tokens: 16, public: true}
  margins: {contains_answer: 0.15}
"""
"""The example's facts suite at its own size (64 items: a paired test at margin 0.15 passes a candidate that loses at
most 3 and gains none; 32 items cannot pass one that loses 1, measured here: lower bound -0.162). One suite keeps
a shared 2-core machine near 15 min per test; the README's command runs all five."""


def test_gate_check_of_llamacpp_against_the_ggufs_parent_passes(tmp_path: Path) -> None:
    llama_server_binary()
    reference, parent = gguf_pair()
    baseline = manifest_file(tmp_path / "parent.yaml", f"include: {parent}\nname: parent\n{QUALITY}")
    text = llamacpp_manifest_text(reference, "llamacpp-gated", tmp_path / "logs") + QUALITY
    candidate = manifest_file(tmp_path / "llamacpp.yaml", text)
    report = run_check(baseline, candidate, mode="change", forced=["quality"], cache=OutputCache(enabled=False))
    verdicts = {g.name: (g.verdict, g.reason) for g in report.gates if g.verdict != "skipped"}
    print(f"\n{reference.name} on llama.cpp against {parent.name}: {verdicts}")
    assert verdicts["quality"][0] == "pass", verdicts
    assert report.candidate.remote is not None and report.candidate.remote.engine == "llama.cpp"


def test_the_exported_server_verifies_and_passes_gate_check_against_its_reference_form(tmp_path: Path) -> None:
    binary = llama_server_binary()
    reference, _ = gguf_pair()
    warm = '\n  warmup: [{prompt: "The capital of France is", max_tokens: 4}]'
    served = manifest_file(
        tmp_path / "llamacpp.yaml", llamacpp_manifest_text(reference, "exported", tmp_path / "logs", warm) + QUALITY
    )
    plan = export_manifest(served, "llamacpp")
    write_export(plan, tmp_path / "export")
    port = free_port()
    env = {**os.environ, "LLAMA_SERVER": str(binary), "HOST": "127.0.0.1", "PORT": str(port)}
    log = (tmp_path / "export.log").open("wb")
    process = subprocess.Popen(
        [str(tmp_path / "export" / SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        _wait_healthy(port, process, tmp_path / "export.log")
        report = verify_deployment(served, f"http://127.0.0.1:{port}", timeout_s=120)
        checks = {c.name: (c.verdict, c.reason) for c in report.checks}
        print(f"\ngate verify of the exported llama-server: {checks}")
        for name in (
            "name",
            "batching.max_batch_size",
            "runtime.max_model_len",
            "weights.gguf_file",
            "preprocess.chat_template",
            "runtime.seed",
            "runtime.backend",
            "runtime.warmup[0].expect",
        ):
            assert checks[name][0] in ("pass", "skipped"), (name, checks[name])
        assert checks["batching.max_batch_size"][0] == "pass" and checks["runtime.backend"][0] == "pass"
        endpoint = served.model_dump(mode="json")
        endpoint["runtime"].update(backend="endpoint", endpoint_url=f"http://127.0.0.1:{port}/v1", llamacpp=None)
        gateway = served.with_changes(runtime=endpoint["runtime"])
        result = run_check(
            gateway.reference_form(), gateway, mode="change", forced=["quality"], cache=OutputCache(enabled=False)
        )
        verdicts = {g.name: (g.verdict, g.reason) for g in result.gates if g.verdict != "skipped"}
        print(f"exported server against its reference form: {verdicts}")
        assert verdicts["quality"][0] == "pass", verdicts
    finally:
        from servegate.runtime.remote.server_process import stop_group

        stop_group(process, 10.0)
        log.close()


def _wait_healthy(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the exported server answers /health (its own log named when it does not)."""
    import time

    import httpx

    end = time.monotonic() + 300
    while time.monotonic() < end:
        if process.poll() is not None:
            raise LlamaCppLaunchError(f"the exported server exited ({process.returncode}); log: {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise LlamaCppLaunchError(f"the exported server was not healthy after 300 s; log: {log}")


def test_the_tenant_timing_audit_runs_against_llamacpps_slots(tmp_path: Path) -> None:
    """llama.cpp caches prompts per slot, not per tenant; with prefix_caching false servegate sends cache_prompt: false,
    so the caching gate's tenant audit must find no tenant's prompt answering another's faster."""
    llama_server_binary()
    reference, _ = gguf_pair()
    text = llamacpp_manifest_text(reference, "llamacpp-tenants", tmp_path / "logs") + QUALITY
    candidate = manifest_file(tmp_path / "tenants.yaml", text + "preprocess: {tenant_from: header}\n")
    report = run_check(
        candidate.reference_form(), candidate, mode="change", forced=["caching"], cache=OutputCache(enabled=False)
    )
    caching = next(g for g in report.gates if g.name == "caching")
    print(f"\ncaching gate on llama.cpp: {caching.verdict}: {caching.reason}")
    assert caching.verdict in ("pass", "warn"), caching.reason
    assert "tenant" in caching.reason and "preprocess.tenant_from is none" not in caching.reason
