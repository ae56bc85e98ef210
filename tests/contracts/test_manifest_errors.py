"""Invalid manifests: each error names FILE:LINE:COL, the field path and what to change."""

from __future__ import annotations

from pathlib import Path

import pytest

from servegate.contracts.errors import ManifestError
from servegate.contracts.loading import load_manifest

HEAD = "apiVersion: servegate/v1\nkind: ServedModel\nname: t\n"

# Each case: manifest body (after HEAD) with the offending line marked `#<`, and a message fragment.
# A case without a marker expects the error on the first line of the file.
CASES: list[tuple[str, str, str]] = [
    ("weights-missing", "runtime:\n  seed: 1\n", "weights: required field is missing"),
    ("unknown-top", "weights: {source: zoo:tiny-primary}\nbatchng:  #<\n  mode: none\n", "did you mean 'batching'?"),
    (
        "unknown-nested",
        "weights: {source: zoo:tiny-primary}\nbatching:\n  max_batch_sise: 4  #<\n",
        "batching.max_batch_sise: unknown key 'max_batch_sise'; did you mean 'max_batch_size'?",
    ),
    (
        "batch-size-zero",
        "weights: {source: zoo:tiny-primary}\nbatching:\n  max_batch_size: 0  #<\n",
        "batching.max_batch_size: must be >= 1 (got 0)",
    ),
    (
        "batch-size-type",
        "weights: {source: zoo:tiny-primary}\nbatching:\n  max_batch_size: lots  #<\n",
        "batching.max_batch_size: must be an integer (got 'lots')",
    ),
    (
        "mode-literal",
        "weights: {source: zoo:tiny-primary}\nbatching:\n  mode: turbo  #<\n",
        "batching.mode: must be one of 'none', 'static', 'dynamic', 'continuous' or 'offline' (got 'turbo')",
    ),
    (
        "wait-negative",
        "weights: {source: zoo:tiny-primary}\nbatching:\n  max_wait_ms: -1  #<\n",
        "batching.max_wait_ms: must be >= 0",
    ),
    (
        "truncation-literal",
        "weights: {source: zoo:tiny-primary}\npreprocess:\n  truncation: top  #<\n",
        "preprocess.truncation: must be one of",
    ),
    (
        "tenant-literal",
        "weights: {source: zoo:tiny-primary}\npreprocess:\n  tenant_from: cookie  #<\n",
        "preprocess.tenant_from: must be one of 'header', 'user' or 'none'",
    ),
    (
        "payload-too-small",
        "weights: {source: zoo:tiny-primary}\npreprocess:\n  max_payload_bytes: 10  #<\n",
        "preprocess.max_payload_bytes: must be >= 256 (got 10)",
    ),
    (
        "token-budget",
        "weights: {source: zoo:tiny-primary}\npreprocess:\n  max_input_tokens: 4000  #<\n"
        "postprocess:\n  max_output_tokens: 200\nruntime:\n  max_model_len: 4096\n",
        "max_input_tokens + postprocess.max_output_tokens (4200) exceeds runtime.max_model_len (4096): "
        "lower one or raise max_model_len",
    ),
    (
        "continuous-needs-kv",
        "weights: {source: zoo:tiny-primary}\nbatching:\n  mode: continuous  #<\n",
        "batching.mode=continuous needs runtime.kv_cache",
    ),
    (
        "chunked-needs-continuous",
        "weights: {source: zoo:tiny-primary}\nbatching:\n  chunked_prefill: true  #<\n",
        "batching.chunked_prefill needs batching.mode=continuous (got none)",
    ),
    (
        "budget-unit",
        "weights: {source: zoo:tiny-primary}\nruntime:\n  kv_cache:\n    memory_budget: 2 gigs  #<\n",
        "runtime.kv_cache.memory_budget: expected a byte size such as 2GiB",
    ),
    (
        "quant-method",
        "weights: {source: zoo:tiny-primary}\nruntime:\n  quantization:\n    method: int5  #<\n",
        "runtime.quantization.method: must be one of",
    ),
    (
        "group-size",
        "weights: {source: zoo:tiny-primary}\nruntime:\n  quantization:\n    method: int4-weight\n"
        "    group_size: 4  #<\n",
        "runtime.quantization.group_size: must be >= 8 (got 4)",
    ),
    (
        "endpoint-url",
        "weights: {source: zoo:tiny-primary}\nruntime:  #<\n  backend: endpoint\n",
        "runtime: backend: endpoint needs endpoint_url",
    ),
    (
        "pickle-opt-in",
        "weights:  #<\n  source: ./model\n  format: pickle\n",
        "weights: format: pickle can run arbitrary code when loaded: set allow_pickle: true",
    ),
    (
        "sha-bad",
        "weights:\n  source: ./model\n  sha256:  #<\n    model.safetensors: abc\n",
        "weights.sha256: sha256 of 'model.safetensors' must be 64 lowercase hex characters",
    ),
    (
        "zoo-name",
        "weights:\n  source: zoo:../../etc  #<\n",
        "weights.source: zoo names are lowercase letters, digits and '-'",
    ),
    (
        "hf-form",
        "weights:\n  source: hf:just-a-name  #<\n",
        "weights.source: hub sources are written hf:ORG/NAME@REVISION",
    ),
    (
        "overload-status",
        "weights: {source: zoo:tiny-primary}\nfailure_policy:\n  overload_status: 500  #<\n",
        "failure_policy.overload_status: must be one of 429 or 503 (got 500)",
    ),
    (
        "timeout-zero",
        "weights: {source: zoo:tiny-primary}\nfailure_policy:\n  request_timeout_s: 0  #<\n",
        "failure_policy.request_timeout_s: must be > 0 (got 0)",
    ),
    (
        "fallback-on",
        "weights: {source: zoo:tiny-primary}\nfailure_policy:\n  fallback:\n    manifest: fb.yaml\n"
        "    triggers: [crash]  #<\n",
        "failure_policy.fallback.triggers.0: must be one of 'overload', 'timeout' or 'error' (got 'crash')",
    ),
    (
        "fallback-on-renamed",
        "weights: {source: zoo:tiny-primary}\nfailure_policy:\n  fallback:  #<\n    manifest: fb.yaml\n"
        "    on: [overload]\n",
        "failure_policy.fallback: `on` is now `triggers` (YAML 1.1 tools read the key `on` as true): rename",
    ),
    (
        "output-schema",
        "weights: {source: zoo:tiny-primary}\npostprocess:\n  output_schema: {type: banana}  #<\n",
        "postprocess.output_schema: not a valid JSON Schema",
    ),
    (
        "empty-stop",
        "weights: {source: zoo:tiny-primary}\npostprocess:\n  stop: ['']  #<\n",
        "postprocess.stop: stop strings cannot be empty",
    ),
    (
        "suite-unknown-key",
        "weights: {source: zoo:tiny-primary}\nquality:\n  suites:\n    - name: a\n      dataset: zoo:arith\n"
        "      publik: true  #<\n",
        "quality.suites.0.publik: unknown key 'publik'; did you mean 'public'?",
    ),
    (
        "margin-range",
        "weights: {source: zoo:tiny-primary}\nquality:\n  margins: {exact_match: 3}  #<\n",
        "quality.margins: margin for 'exact_match' is a score difference between 0 and 1 (got 3.0)",
    ),
    (
        "confidence-range",
        "weights: {source: zoo:tiny-primary}\nquality:\n  confidence: 1.5  #<\n",
        "quality.confidence: must be < 1 (got 1.5)",
    ),
    (
        "workload-rate",
        "weights: {source: zoo:tiny-primary}\ncapacity:\n  workload:  #<\n    arrival: poisson\n",
        "capacity.workload: arrival: poisson needs rate_rps",
    ),
    (
        "api-version",
        "apiVersion: servegate/v2  #<\nweights: {source: zoo:tiny-primary}\n",
        "apiVersion: must be one of 'servegate/v1' (got 'servegate/v2')",
    ),
    (
        "name-pattern",
        "weights: {source: zoo:tiny-primary}\nname: has spaces  #<\n",
        "name: must match",
    ),
    (
        "section-not-mapping",
        "weights: {source: zoo:tiny-primary}\nbatching: fast  #<\n",
        "batching: must be a mapping of fields (got 'fast')",
    ),
    ("yaml-syntax", "weights: {source: zoo:tiny-primary\nbatching:\n  mode: none\n", "expected ',' or '}'"),
]


def _write(tmp_path: Path, body: str) -> Path:
    # Cases that set apiVersion or name themselves replace the header's line.
    head = HEAD
    if body.startswith("apiVersion"):
        head = head.replace("apiVersion: servegate/v1\n", "")
    if "\nname:" in body:
        head = head.replace("name: t\n", "")
    path = tmp_path / "manifest.yaml"
    path.write_text(head + body, encoding="utf-8")
    return path


@pytest.mark.parametrize(("case", "body", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_invalid_manifest_is_located(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, body: str, fragment: str
) -> None:
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, body)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    problems = info.value.problems
    matching = [p for p in problems if fragment in p]
    assert matching, f"{fragment!r} not in {problems}"
    lines = path.read_text().splitlines()
    marked = [i for i, line in enumerate(lines, start=1) if line.rstrip().endswith("#<")]
    if marked:
        line = lines[marked[0] - 1]
        column = len(line) - len(line.lstrip(" -")) + 1
        where = matching[0].split(": ", 1)[0].split(":")
        assert where[:2] == ["manifest.yaml", str(marked[0])], matching[0]
        # flow-style values ({a: 1}, [x]) point at the exact item, further right than the key
        assert int(where[2]) >= column, matching[0]
    else:
        assert matching[0].startswith("manifest.yaml:"), matching[0]


def test_at_least_25_cases() -> None:
    assert len(CASES) >= 25


def test_all_problems_are_reported_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, "weights: {source: zoo:tiny-primary}\nbatching:\n  max_batch_size: 0\n  mode: x\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert len(info.value.problems) == 2
    assert info.value.problems[0].startswith("manifest.yaml:6:3: batching.max_batch_size")
    assert info.value.problems[1].startswith("manifest.yaml:7:3: batching.mode")


def test_empty_and_non_mapping_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ManifestError, match=r"empty.yaml:1:1: the manifest is empty"):
        load_manifest(tmp_path / "empty.yaml")
    with pytest.raises(ManifestError, match=r"list.yaml:1:1: the manifest must be a mapping"):
        load_manifest(tmp_path / "list.yaml")
    with pytest.raises(ManifestError, match=r"missing.yaml: file not found"):
        load_manifest(tmp_path / "missing.yaml")


def test_duplicate_keys_are_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, "weights: {source: zoo:tiny-primary}\nbatching:\n  mode: none\n  mode: static\n")
    with pytest.raises(ManifestError, match=r"manifest.yaml:\d+:\d+: .*duplicate"):
        load_manifest(path)


def test_unloadable_fallback_is_reported_at_its_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fb.yaml").write_text(HEAD + "weights: {source: zoo:tiny-fallback}\nbatching: {mode: warp}\n")
    path = _write(
        tmp_path, "weights: {source: zoo:tiny-primary}\nfailure_policy:\n  fallback:\n    manifest: fb.yaml\n"
    )
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    message = info.value.problems[0]
    assert message.startswith("manifest.yaml:7:5: failure_policy.fallback.manifest: cannot load the fallback manifest")
    assert "fb.yaml:5:12: batching.mode: must be one of" in message


def test_fallback_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fb = "failure_policy:\n  fallback:\n    manifest: {}\n"
    (tmp_path / "a.yaml").write_text(HEAD + "weights: {source: zoo:tiny-primary}\n" + fb.format("b.yaml"))
    (tmp_path / "b.yaml").write_text(HEAD + "weights: {source: zoo:tiny-fallback}\n" + fb.format("a.yaml"))
    with pytest.raises(ManifestError, match="fallback cycle"):
        load_manifest(tmp_path / "a.yaml")
