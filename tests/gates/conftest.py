"""Shared manifests and a fake-engine check runner for the gate tests.

The manifests mirror the quickstart (continuous batching, int8, prefix and response caches per tenant,
left truncation at 64 tokens, a fallback) on 80 items per zoo suite: the smallest n at which an exact
non-inferiority test can pass at a 5-point margin is 72.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.oracle_engine import Faults, fake_factory

from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.gates.check import run_check
from servegate.gates.result import GateReport
from servegate.gates.suites.output_cache import OutputCache

BASE = """\
apiVersion: servegate/v1
kind: ServedModel
name: gated
version: 1.0.0
weights: {source: zoo:tiny-primary}
preprocess: {chat_template: none, max_input_tokens: 64, truncation: left, tenant_from: header}
runtime:
  max_model_len: 128
  quantization: {method: int8-weight}
  kv_cache: {block_size: 16, memory_budget: 1MiB, prefix_caching: true, cache_scope: tenant}
batching: {mode: continuous, max_batch_size: 8, max_num_batched_tokens: 256}
postprocess:
  max_output_tokens: 32
  response_cache: {enabled: true, scope: tenant}
failure_policy:
  fallback: {manifest: fallback.yaml, triggers: [overload, timeout], boundary: {exact_match: 0.5}}
quality:
  suites:
    - {name: arith, dataset: zoo:arith, limit: 80, public: true}
    - {name: recall, dataset: zoo:recall, limit: 80, public: true}
    - {name: json, dataset: zoo:json, limit: 80, metrics: [exact_match, json_schema_valid]}
  margins: {exact_match: 0.05, json_schema_valid: 0.05}
"""

FALLBACK = """\
apiVersion: servegate/v1
kind: ServedModel
name: gated-fallback
weights: {source: zoo:tiny-fallback}
preprocess: {chat_template: none, max_input_tokens: 64, truncation: left}
runtime: {max_model_len: 128}
batching: {mode: dynamic, max_batch_size: 8}
postprocess: {max_output_tokens: 32}
"""

VARIANTS = {
    "int2.yaml": "include: base.yaml\nruntime: {quantization: {method: int2-weight}}\n",
    "tight.yaml": "include: base.yaml\npreprocess: {max_input_tokens: 24}\n",
    "reject.yaml": "include: base.yaml\npreprocess: {max_input_tokens: 40, truncation: reject}\n",
    "global-cache.yaml": "include: base.yaml\nruntime: {kv_cache: {cache_scope: global}}\n",
    "single-tenant-global.yaml": (
        "include: base.yaml\npreprocess: {tenant_from: none}\nruntime: {kv_cache: {cache_scope: global}}\n"
    ),
    "fallback-short.yaml": "include: fallback.yaml\npostprocess: {max_output_tokens: 8}\n",
    "broken-fallback.yaml": "include: base.yaml\nfailure_policy: {fallback: {manifest: fallback-short.yaml}}\n",
    "reference.yaml": (
        "include: base.yaml\nruntime: {quantization: {method: none}, kv_cache: {prefix_caching: false}}\n"
        "batching: {mode: none, max_batch_size: 1}\n"
    ),
}


@pytest.fixture(scope="session")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the base manifest, its fallback and one-change variants."""
    folder = tmp_path_factory.mktemp("manifests")
    (folder / "base.yaml").write_text(BASE)
    (folder / "fallback.yaml").write_text(FALLBACK)
    for name, text in VARIANTS.items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="session")
def load(manifests: Path) -> Callable[..., ServedModel]:
    """Load one of the test manifests by file name, with optional --set overrides."""

    def _load(name: str, *sets: str) -> ServedModel:
        return load_manifest(manifests / name, list(sets))

    return _load


@pytest.fixture
def check(tmp_path: Path) -> Callable[..., GateReport]:
    """Run `gate check` logic on fake engines (reference mode for one manifest, change mode for two)."""

    def _check(
        candidate: ServedModel,
        baseline: ServedModel | None = None,
        *,
        gates: tuple[str, ...] = (),
        faults: Faults = Faults(),  # noqa: B008
        cache: OutputCache | None = None,
    ) -> GateReport:
        factory = fake_factory(faults)
        cache = cache or OutputCache(tmp_path / "cache")
        if baseline is None:
            return run_check(candidate.reference_form(), candidate, mode="reference", forced=gates,
                             engine_factory=factory, cache=cache)  # fmt: skip
        return run_check(baseline, candidate, mode="change", forced=gates, engine_factory=factory, cache=cache)

    return _check
