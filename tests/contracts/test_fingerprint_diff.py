"""Fingerprint stability, what changes it, and the diff with the gates it triggers."""

from __future__ import annotations

import typing
from pathlib import Path

import pydantic
import pytest

from servegate.contracts.diff import GATE_WATCHES, diff_manifests, diff_report, gates_for_path
from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import SIX_ELEMENTS, ServedModel

A = """name: a
weights: {source: zoo:tiny-primary}
batching: {mode: dynamic, max_batch_size: 8}
card: {public_name: x}
"""
# Same content, other key order, flow vs block style and comments.
A_REORDERED = """# a comment
card:
  public_name: x
batching:
  max_batch_size: 8
  mode: dynamic

weights:
    source: "zoo:tiny-primary"
name: a
"""


def _load(tmp_path: Path, text: str, name: str = "m.yaml", sets: list[str] | None = None):
    path = tmp_path / name
    path.write_text(text)
    return load_manifest(path, sets or [])


def test_fingerprint_stable_under_key_order_and_whitespace(tmp_path: Path) -> None:
    assert _load(tmp_path, A, "a.yaml").fingerprint == _load(tmp_path, A_REORDERED, "b.yaml").fingerprint


def test_fingerprint_ignores_cosmetic_fields(tmp_path: Path) -> None:
    base = _load(tmp_path, A)
    for expr in [
        "name=other",
        "description=words",
        "card.public_name=y",
        "version=9.9.9",
        "quality.confidence=0.9",
        "capacity.cost_per_hour=3",
    ]:
        assert _load(tmp_path, A, sets=[expr]).fingerprint == base.fingerprint, expr


@pytest.mark.parametrize(
    "expr",
    [
        "weights.dtype=float16",
        "weights.sha256={model.safetensors: " + "a" * 64 + "}",
        "preprocess.truncation=left",
        "preprocess.max_input_tokens=100",
        "preprocess.tenant_from=header",
        "runtime.quantization.method=int8-weight",
        "runtime.seed=7",
        "runtime.decode_attention=sdpa",
        "batching.max_batch_size=4",
        "batching.mode=static",
        "postprocess.stop=[x]",
        "postprocess.response_cache.enabled=true",
        "failure_policy.max_queue=3",
        "failure_policy.overload_status=503",
    ],
)
def test_fingerprint_changes_with_any_behaviour_field(tmp_path: Path, expr: str) -> None:
    assert _load(tmp_path, A, sets=[expr]).fingerprint != _load(tmp_path, A).fingerprint


def test_a_field_added_at_its_default_keeps_the_fingerprints_written_before_it(tmp_path: Path) -> None:
    assert _load(tmp_path, A, sets=["runtime.decode_attention=auto"]).fingerprint == _load(tmp_path, A).fingerprint


def test_fingerprint_is_sha256_hex(tmp_path: Path) -> None:
    fp = _load(tmp_path, A).fingerprint
    assert len(fp) == 64 and int(fp, 16) >= 0


def test_diff_lists_changed_fields_and_gates(tmp_path: Path) -> None:
    a = _load(tmp_path, A)
    b = _load(
        tmp_path,
        A,
        sets=["runtime.quantization.method=int4-weight", "preprocess.truncation=left", "card.public_name=y"],
    )
    changes = {c.path: c for c in diff_manifests(a, b)}
    assert changes["runtime.quantization.method"].old == "none"
    assert changes["runtime.quantization.method"].new == "int4-weight"
    assert changes["runtime.quantization.method"].gates == ("quantization", "capacity")
    assert "truncation" in changes["preprocess.truncation"].gates
    assert changes["card.public_name"].gates == ()
    report = diff_report(a, b)
    assert set(report["gates"]) >= {"quantization", "truncation"}
    assert report["behaviour_elements_changed"] == ["preprocess", "runtime"]
    assert report["same_behaviour"] is False


def test_diff_of_a_section_switched_on_lists_its_leaves(tmp_path: Path) -> None:
    a = _load(tmp_path, A)
    b = _load(tmp_path, A, sets=["runtime.kv_cache={memory_budget: 1MiB, prefix_caching: false}"])
    paths = {c.path for c in diff_manifests(a, b)}
    assert "runtime.kv_cache.memory_budget" in paths and "runtime.kv_cache.block_size" in paths


def test_identical_manifests_have_no_diff(tmp_path: Path) -> None:
    a = _load(tmp_path, A)
    assert diff_manifests(a, a) == []
    assert diff_report(a, a)["same_behaviour"] is True


def _leaves(model: type[pydantic.BaseModel], prefix: str) -> list[str]:
    """Every leaf field of a manifest section, dotted (sub-sections opened)."""
    out = []
    for name, info in model.model_fields.items():
        kinds = typing.get_args(info.annotation) or (info.annotation,)
        sections = [k for k in kinds if isinstance(k, type) and issubclass(k, pydantic.BaseModel)]
        out += [leaf for k in sections for leaf in _leaves(k, f"{prefix}.{name}")] or [f"{prefix}.{name}"]
    return out


def test_every_field_of_the_six_elements_triggers_some_gate() -> None:
    leaves = [leaf for e in SIX_ELEMENTS for leaf in _leaves(ServedModel.model_fields[e].annotation, e)]
    assert len(leaves) > 50
    assert [leaf for leaf in leaves if not gates_for_path(leaf)] == []
    assert gates_for_path("runtime.kv_cache.cache_scope") == ("caching", "batching", "load", "capacity")
    assert gates_for_path("card.public_name") == ()
    assert all(prefixes for prefixes in GATE_WATCHES.values())


def test_a_change_triggers_every_gate_watching_it_or_a_field_above_it() -> None:
    assert gates_for_path("weights.dtype") == ("contract", "quantization", "quality")
    assert gates_for_path("runtime.compile_batch_sizes") == ("batching", "quality", "capacity")
    assert gates_for_path("runtime.compiled") == ()  # a prefix matches whole names only
    plugin = {**GATE_WATCHES, "toxicity": ("postprocess.stop",)}
    assert gates_for_path("postprocess.stop", plugin) == ("contract", "toxicity")


def test_another_backend_or_engine_runs_the_gates_of_what_it_replaces() -> None:
    # vLLM instead of the reference engine brings its own truncation, prefix cache and scheduler
    replaced = ("contract", "truncation", "caching", "batching", "load", "quality", "capacity")
    assert gates_for_path("runtime.backend") == replaced
    assert gates_for_path("runtime.engine.version") == replaced


def test_reference_form_switches_every_optimization_off(tmp_path: Path) -> None:
    served = load_manifest(Path(__file__).parents[2] / "examples/quickstart/manifest.yaml")
    ref = served.reference_form()
    assert ref.runtime.quantization.method == "none"
    assert ref.batching.mode == "none"
    assert ref.runtime.kv_cache is not None and not ref.runtime.kv_cache.prefix_caching
    assert not ref.postprocess.response_cache.enabled
    assert ref.preprocess.truncation == "reject"
    assert ref.failure_policy.fallback is None
    assert ref.weights == served.weights and ref.quality == served.quality
    assert ref.fingerprint != served.fingerprint
