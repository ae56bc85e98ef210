"""The round trip: `gate export --target vllm`, vLLM started from the exported files, gated against the reference.

The exported `config.yaml` and `vllm.env` are all vLLM gets (no argument of servegate's own on the command
line); the manifest then reaches that server as an endpoint and `gate check` gates it against its own
reference form on servegate's runtime. A field vLLM cannot express (the truncation policy) is listed in
RESIDUAL.md as enforced by servegate's gateway, and the endpoint engine enforces it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from engines_support import READY_TIMEOUT_S
from ruamel.yaml import YAML
from support.manifests import manifest_file

from servegate.gates.check import check_manifest
from servegate.gates.suites.output_cache import OutputCache
from servegate.runtime.remote.server_process import free_port
from servegate.runtime.remote.vllm_process import VllmServer

pytestmark = pytest.mark.engines

MANIFEST = """name: tiny-export
weights: {source: zoo:tiny-primary, dtype: float32}
preprocess: {max_input_tokens: 96, truncation: left}
runtime:
  device: cpu
  dtype: float32
  max_model_len: 256
  kv_cache: {block_size: 32, memory_budget: 256MiB, prefix_caching: false}
batching: {mode: continuous, max_batch_size: 8, max_num_batched_tokens: 512}
postprocess: {max_output_tokens: 32}
quality:
  suites:
    - {name: arith, dataset: "zoo:arith", limit: 80, public: true}
    - {name: recall, dataset: "zoo:recall", limit: 80, public: true}
  margins: {exact_match: 0.05}
"""


@dataclass(frozen=True)
class ConfigLaunch:
    """vLLM started from exported files only: `--config config.yaml` plus the exported environment."""

    python: Path
    config: Path
    env_file: Path
    served_model_name: str
    cache_root: Path
    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"

    @property
    def base_url(self) -> str:
        """The server's root URL."""
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The exported config, and where to listen (the export leaves host and port to the deployment)."""
        return [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--config", str(self.config),
                "--host", self.host, "--port", str(self.port)]  # fmt: skip

    def environment(self) -> dict[str, str]:
        """This machine's environment with the exported variables and the offline/cache settings of the suite."""
        import os

        env = dict(os.environ)
        for line in self.env_file.read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and not name.startswith("#"):
                env[name.strip()] = value.strip().strip('"')
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
        env.update(VLLM_CACHE_ROOT=str(self.cache_root), HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
        return env


def test_the_exported_vllm_config_serves_what_was_gated(vllm_python: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "tiny.yaml"
    manifest.write_text(MANIFEST)
    out = tmp_path / "export"
    exported = subprocess.run([sys.executable, "-m", "servegate.cli", "export", str(manifest), "--target", "vllm",
                               "-o", str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    residuals = json.loads((out / "residual.json").read_text())
    truncation = [r for r in residuals["residuals"] if r["field"] == "preprocess.truncation"]
    assert truncation and truncation[0]["enforced_by"] == "gateway", residuals
    config = YAML(typ="safe").load((out / "config.yaml").read_text())
    launch = ConfigLaunch(vllm_python, out / "config.yaml", out / "vllm.env", str(config["served-model-name"]),
                          tmp_path / "vllm-cache")  # fmt: skip
    server = VllmServer(launch, tmp_path / "vllm.log")  # type: ignore[arg-type]
    server.start()
    try:
        server.wait_ready("the model 123+456=", max_tokens=8, expect="0579", timeout_s=READY_TIMEOUT_S)
        endpoint = manifest_file(
            tmp_path / "endpoint.yaml",
            MANIFEST.replace(
                "runtime:\n",
                f"runtime:\n  backend: endpoint\n  endpoint_url: {launch.base_url}/v1\n"
                f"  endpoint_model: {launch.served_model_name}\n",
            ),
        )
        report = check_manifest(endpoint, cache=OutputCache(enabled=False))
    finally:
        server.stop()
    ran = {g.name: (g.verdict, g.reason) for g in report.gates if g.verdict != "skipped"}
    print("\n" + "\n".join(f"{name}: {verdict}: {reason}" for name, (verdict, reason) in ran.items()))
    assert "quality" in ran and "truncation" in ran and "contract" in ran
    assert report.verdict == "pass", ran
    assert report.candidate.remote.engine == "vllm"
