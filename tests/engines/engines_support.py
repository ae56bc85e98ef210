"""Shared pieces of the engines tests: the suite's vLLM launch settings and the manifests written against it."""

from __future__ import annotations

from pathlib import Path

from support.manifests import manifest_file

from servegate.contracts.manifest import ServedModel
from servegate.runtime.remote.server_process import free_port
from servegate.runtime.remote.vllm_process import VllmLaunch, VllmServer

SERVED_NAME = "tiny-primary"
"""The name the vLLM server serves zoo:tiny-primary under (`--served-model-name`)."""
MAX_MODEL_LEN = 256
"""--max-model-len of every server here, and runtime.max_model_len of the manifests."""
READY_TIMEOUT_S = 300.0
"""How long a server may take to answer its first completion (52-148 s seen on 2 shared cores)."""
READY_PROMPT, READY_ANSWER = "the model 123+456=", "0579"
"""The readiness completion and the answer zoo:tiny-primary gives it (greedy)."""


def launch_for(python: Path, model: Path, name: str, workdir: Path, **options: object) -> VllmLaunch:
    """The test suite's launch: a free port, fp32, max_model_len 256, seed 0, 1 GiB of KV, 2 threads."""
    return VllmLaunch(
        python=python,
        model=model,
        served_model_name=name,
        port=free_port(),
        cache_root=workdir / "vllm-cache",
        max_model_len=MAX_MODEL_LEN,
        **options,  # type: ignore[arg-type]
    )


STRUCTURED = "\n  structured_output:\n    whitespace: compact"
"""postprocess lines that declare constrained decoding (compact JSON), for the manifests below."""


def endpoint_manifest(
    directory: Path, server: VllmServer, weights: str = "zoo:tiny-primary", postprocess: str = ""
) -> ServedModel:
    """An endpoint manifest pointing at a running vLLM server (the shape a user writes for a remote);
    `postprocess`: more lines of that section (e.g. STRUCTURED)."""
    return manifest_file(
        directory / "vllm-endpoint.yaml",
        f"""name: vllm-endpoint
weights:
  source: {weights}
runtime:
  backend: endpoint
  endpoint_url: {server.launch.base_url}/v1
  endpoint_model: {server.launch.served_model_name}
  max_model_len: {MAX_MODEL_LEN}
preprocess:
  max_input_tokens: 128
postprocess:
  max_output_tokens: 32{postprocess}
failure_policy:
  request_timeout_s: 120
""",
    )


def reference_manifest(directory: Path, weights: str = "zoo:tiny-primary", postprocess: str = "") -> ServedModel:
    """servegate's reference runtime on the same weights, fp32, no quantization or caching; `postprocess`: more
    lines of that section."""
    return manifest_file(
        directory / "reference.yaml",
        f"""name: reference
weights:
  source: {weights}
  dtype: float32
runtime:
  backend: reference
  dtype: float32
  max_model_len: {MAX_MODEL_LEN}
  seed: 0
preprocess:
  max_input_tokens: 128
postprocess:
  max_output_tokens: 32{postprocess}
""",
    )
