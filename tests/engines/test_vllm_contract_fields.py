"""The contract gate's field measurements against a real vLLM: its seed is honoured where draws differ, its context
is the one it reports, and the context probe reads vLLM's own answers (accepted whole, or refused past it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from engines_support import MAX_MODEL_LEN, SERVED_NAME
from support.manifests import manifest_file

from servegate.contracts.manifest import ServedModel
from servegate.gates.check import run_check
from servegate.gates.probes.contract_measure import measure_context
from servegate.gates.suites.output_cache import OutputCache
from servegate.runtime.model.weights import load_tokenizer
from servegate.runtime.remote.vllm_process import VllmServer

pytestmark = pytest.mark.engines

REFERENCE = f"""name: reference
weights: {{source: zoo:tiny-primary, dtype: float32}}
runtime: {{dtype: float32, max_model_len: {MAX_MODEL_LEN}}}
preprocess: {{max_input_tokens: 128}}
postprocess: {{max_output_tokens: 32}}
quality: {{suites: [{{name: arith, dataset: "zoo:arith", limit: 8, public: true}}]}}
"""


def endpoint(
    directory: Path, server: VllmServer, max_model_len: int = MAX_MODEL_LEN, max_input_tokens: int = 128
) -> ServedModel:
    return manifest_file(
        directory / "vllm-fields.yaml",
        f"""name: vllm-fields
weights: {{source: zoo:tiny-primary}}
runtime: {{backend: endpoint, endpoint_url: "{server.launch.base_url}/v1", endpoint_model: {SERVED_NAME},
          max_model_len: {max_model_len}}}
preprocess: {{max_input_tokens: {max_input_tokens}}}
postprocess: {{max_output_tokens: 32}}
quality: {{suites: [{{name: arith, dataset: "zoo:arith", limit: 8, public: true}}]}}
""",
    )


def test_the_contract_gate_measures_vllms_seed_and_reads_its_context(vllm_server: VllmServer, tmp_path: Path) -> None:
    base = manifest_file(tmp_path / "reference.yaml", REFERENCE)
    report = run_check(base, endpoint(tmp_path, vllm_server), mode="change", forced=["contract"],
                       cache=OutputCache(enabled=False))  # fmt: skip
    [contract] = [g for g in report.gates if g.name == "contract"]
    assert contract.verdict == "pass", contract.reason
    checked = contract.measurements.checked
    assert checked["runtime.max_model_len"] == f"reported: the remote reports max_model_len {MAX_MODEL_LEN} " + (
        f"(declared {MAX_MODEL_LEN})"
    )
    assert checked["seed"].startswith("measured: draws with different seeds differ")


def test_the_context_probe_reads_vllms_answers(vllm_server: VllmServer, tmp_path: Path) -> None:
    """Declared 256: vLLM keeps all 255 prompt tokens. Declared 320: it refuses 319 (400); the longest request
    of a front with 128 input tokens (128 + 32) fits, so the context is not verified; one of 288 + 32 does not."""

    async def probe(declared: int, max_input_tokens: int) -> Any:
        served = endpoint(tmp_path, vllm_server, declared, max_input_tokens)
        async with httpx.AsyncClient(timeout=120) as client:
            url = f"{vllm_server.launch.base_url}/v1"
            return await measure_context(client, url, SERVED_NAME, served, load_tokenizer(served))

    held = asyncio.run(probe(MAX_MODEL_LEN, 128))
    assert (held.how, held.problem) == ("measured", None), held.detail
    assert held.detail == "a prompt of 255 tokens with 1 to generate (the declared 256) accepted whole"
    unknown = asyncio.run(probe(MAX_MODEL_LEN + 64, 128))
    assert unknown.how == "not verified" and unknown.detail.startswith("the remote refused a prompt of 319 tokens")
    over = asyncio.run(probe(MAX_MODEL_LEN + 64, 288))
    assert over.problem is not None and "refused a prompt of 288 tokens with 32 to generate" in over.problem
