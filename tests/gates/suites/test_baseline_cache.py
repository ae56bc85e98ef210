"""The baseline cache between CI runs: an entry is used only under its whole key, and the key moves with the
servegate version, the engine, the weights' content, the suites and the fallback (`gate cache-key`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.cli import GateRun, in_process_gate

import servegate.gates.suites.output_cache as output_cache
from servegate.contracts.loading import load_manifest
from servegate.contracts.quality_section import Suite
from servegate.gates.baseline_cache import baseline_cache_key
from servegate.gates.suites.evaluation import ItemOutput, SuiteData
from servegate.gates.suites.output_cache import OutputCache, cache_key

MANIFEST = """\
apiVersion: servegate/v1
kind: ServedModel
name: cached
weights: {source: zoo:tiny-primary}
preprocess: {max_input_tokens: 64}
runtime: {max_model_len: 128}
postprocess: {max_output_tokens: 16}
failure_policy:
  fallback: {manifest: fallback.yaml, triggers: [overload]}
quality:
  suites:
    - {name: arith, dataset: arith.jsonl, metrics: [exact_match]}
"""
FALLBACK = "kind: ServedModel\nname: fb\nweights: {source: zoo:tiny-fallback}\n"


def _data(digest: str = "d" * 64) -> SuiteData:
    return SuiteData(Suite(name="s", dataset="x.jsonl"), (), digest, None)


def test_a_foreign_entry_under_the_same_file_name_is_never_used(tmp_path: Path) -> None:
    cache, data = OutputCache(tmp_path), _data()
    mine, foreign = "a" * 64, "a" * 32 + "b" * 32  # the file name holds only the key's first 32 digits
    cache.store(foreign, data, [ItemOutput("i", "another baseline's answer")])
    assert cache.path(mine, data) == cache.path(foreign, data)
    assert cache.load(mine, data) is None
    assert (cache.hits, cache.misses, cache.rejected) == (0, 1, 1)
    assert "1 entry(ies) on disk not used" in cache.summary()
    assert cache.load(foreign, data) == [ItemOutput("i", "another baseline's answer")]


def test_an_entry_of_another_suite_digest_or_format_is_a_miss(tmp_path: Path) -> None:
    cache, data = OutputCache(tmp_path), _data()
    cache.store("a" * 64, data, [ItemOutput("i", "t")])
    record = json.loads(cache.path("a" * 64, data).read_text())
    cache.path("a" * 64, data).write_text(json.dumps({**record, "digest": "d" * 16 + "e" * 48}))
    assert cache.load("a" * 64, data) is None
    cache.path("a" * 64, data).write_text(json.dumps({**record, "format": 1}))
    assert cache.load("a" * 64, data) is None and cache.rejected == 2


def test_the_key_moves_with_servegate_version_and_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    served = load_manifest(Path(__file__).parents[3] / "examples" / "minimal.yaml")
    key = cache_key(served)
    assert cache_key(served) == key
    monkeypatch.setattr(output_cache, "__version__", "99.0")
    assert cache_key(served) != key
    monkeypatch.undo()
    identity = output_cache.engine_identity(served)
    assert identity["backend"] == "reference" and {"torch", "transformers", "device"} <= set(identity)
    monkeypatch.setattr(output_cache, "_reference_runtime", lambda device: {"torch": "0.0", "device": "cpu"})
    assert cache_key(served) != key


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "m.yaml").write_text(MANIFEST)
    (root / "fallback.yaml").write_text(FALLBACK)
    (root / "arith.jsonl").write_text('{"id": "1", "prompt": "1+1=", "reference": "2"}\n')
    return root


def test_the_ci_key_moves_with_suites_and_fallback_only(project: Path) -> None:
    def key() -> str:
        served = load_manifest(project / "m.yaml")
        return baseline_cache_key(served, served, "change").key

    first = key()
    assert re.fullmatch(r"servegate-baseline-[0-9a-f]{40}", first) and key() == first
    (project / "arith.jsonl").write_text('{"id": "1", "prompt": "1+1=", "reference": "3"}\n')
    second = key()
    assert second != first
    (project / "fallback.yaml").write_text(FALLBACK.replace("name: fb", "name: fb\nversion: 2.0.0"))
    assert key() == second  # name and version are cosmetic: the fallback serves the same
    (project / "fallback.yaml").write_text(FALLBACK + "postprocess: {max_output_tokens: 4}\n")
    assert key() != second


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> GateRun:
    return in_process_gate(monkeypatch, tmp_path, capsys)


def test_gate_cache_key_prints_the_key_and_its_parts(gate: GateRun, project: Path) -> None:
    code, out, _ = gate("cache-key", str(project / "m.yaml"))
    assert code == 0 and re.fullmatch(r"servegate-baseline-[0-9a-f]{40}\n", out)
    code, out, _ = gate("cache-key", "--baseline", str(project / "m.yaml"), "--candidate", str(project / "m.yaml"),
                        "--json", "-")  # fmt: skip
    parts = json.loads(out)
    assert parts["mode"] == "change" and set(parts["manifests"]) == {"baseline", "fallback"}
    assert set(parts["suites"]) == {"arith"} and parts["key"].startswith("servegate-baseline-")
    code, _, err = gate("cache-key", str(project / "m.yaml"), "--baseline", "x.yaml")
    assert code == 2 and err == "error: give either MANIFEST or --baseline A --candidate B, not both\n"
