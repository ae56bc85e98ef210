"""include: merging, cycles, --set overrides and JSON manifests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from servegate.contracts.errors import ManifestError, ServegateError
from servegate.contracts.loading import deep_merge, load_manifest, parse_set

BASE = """apiVersion: servegate/v1
kind: ServedModel
name: base
weights:
  source: zoo:tiny-primary
batching:
  mode: dynamic
  max_batch_size: 8
  max_wait_ms: 5
postprocess:
  stop: ["\\n"]
"""


@pytest.fixture()
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "base.yaml"
    path.write_text(BASE)
    return path


def test_include_deep_merges_the_base_under_the_file(base: Path) -> None:
    variant = base.parent / "variant.yaml"
    variant.write_text("include: base.yaml\nname: variant\nbatching:\n  max_batch_size: 4\n")
    served = load_manifest(variant)
    assert served.name == "variant"
    assert served.batching.max_batch_size == 4
    assert served.batching.mode == "dynamic"  # kept from the base
    assert served.batching.max_wait_ms == 5
    assert served.postprocess.stop == ["\n"]


def test_include_paths_are_relative_to_the_including_file(base: Path) -> None:
    sub = base.parent / "sub"
    sub.mkdir()
    (sub / "v.yaml").write_text("include: ../base.yaml\nname: v\n")
    assert load_manifest(sub / "v.yaml").batching.mode == "dynamic"


def test_include_list_merges_in_order(base: Path) -> None:
    (base.parent / "extra.yaml").write_text("batching:\n  max_batch_size: 16\n")
    (base.parent / "v.yaml").write_text("include: [base.yaml, extra.yaml]\n")
    assert load_manifest(base.parent / "v.yaml").batching.max_batch_size == 16


def test_error_in_included_file_points_into_that_file(base: Path) -> None:
    (base.parent / "bad-base.yaml").write_text(BASE.replace("max_batch_size: 8", "max_batch_size: -2"))
    (base.parent / "v.yaml").write_text("include: bad-base.yaml\nname: v\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(base.parent / "v.yaml")
    assert info.value.problems == ["bad-base.yaml:8:3: batching.max_batch_size: must be >= 1 (got -2)"]


def test_override_in_including_file_points_at_the_override(base: Path) -> None:
    (base.parent / "v.yaml").write_text("include: base.yaml\nbatching:\n  max_batch_size: 0\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(base.parent / "v.yaml")
    assert info.value.problems == ["v.yaml:3:3: batching.max_batch_size: must be >= 1 (got 0)"]


def test_include_cycle_is_reported_with_the_chain(base: Path) -> None:
    (base.parent / "a.yaml").write_text("include: b.yaml\n")
    (base.parent / "b.yaml").write_text("include: a.yaml\n")
    with pytest.raises(ManifestError, match=r"include cycle: a.yaml -> b.yaml -> a.yaml"):
        load_manifest(base.parent / "a.yaml")


def test_missing_include(base: Path) -> None:
    (base.parent / "v.yaml").write_text("include: nope.yaml\n")
    with pytest.raises(ManifestError, match=r"nope.yaml: file not found"):
        load_manifest(base.parent / "v.yaml")


def test_bad_include_value(base: Path) -> None:
    (base.parent / "v.yaml").write_text("name: x\ninclude: {a: 1}\n")
    with pytest.raises(ManifestError, match=r"v.yaml:2:1: include: must be a file path or a list of paths"):
        load_manifest(base.parent / "v.yaml")


def test_deep_merge_replaces_lists_and_scalars() -> None:
    merged = deep_merge({"a": {"b": 1, "c": [1, 2]}, "d": 1}, {"a": {"c": [3]}, "d": {"e": 2}})
    assert merged == {"a": {"b": 1, "c": [3]}, "d": {"e": 2}}


@pytest.mark.parametrize(
    ("expr", "path", "value"),
    [
        ("batching.mode=continuous", ["batching", "mode"], "continuous"),
        ("batching.max_batch_size=4", ["batching", "max_batch_size"], 4),
        ("batching.max_wait_ms=2.5", ["batching", "max_wait_ms"], 2.5),
        ("runtime.kv_cache.prefix_caching=true", ["runtime", "kv_cache", "prefix_caching"], True),
        ('postprocess.stop=[END, "\\n"]', ["postprocess", "stop"], ["END", "\n"]),
        ("runtime.kv_cache={memory_budget: 1GiB}", ["runtime", "kv_cache"], {"memory_budget": "1GiB"}),
        ("description=a=b", ["description"], "a=b"),
    ],
)
def test_parse_set(expr: str, path: list[str], value: object) -> None:
    assert parse_set(expr) == (path, value)


@pytest.mark.parametrize("expr", ["batching.mode", "=3", "batching..mode=x", "a b=1"])
def test_parse_set_rejects_malformed(expr: str) -> None:
    with pytest.raises(ServegateError, match=r"^--set "):
        parse_set(expr)


def test_set_overrides_are_validated_like_the_file(base: Path) -> None:
    served = load_manifest(base, ["batching.max_batch_size=2", "runtime.kv_cache.memory_budget=1MiB"])
    assert served.batching.max_batch_size == 2
    assert served.runtime.kv_cache is not None and served.runtime.kv_cache.memory_budget == 2**20
    with pytest.raises(ManifestError) as info:
        load_manifest(base, ["batching.max_batch_size=0"])
    assert info.value.problems == ["--set batching.max_batch_size=0: batching.max_batch_size: must be >= 1 (got 0)"]
    with pytest.raises(ManifestError, match=r"--set batching.modee=x: batching.modee: unknown key 'modee'; did you "):
        load_manifest(base, ["batching.modee=x"])


def test_set_into_a_list_item(base: Path) -> None:
    (base.parent / "q.yaml").write_text(
        "include: base.yaml\nquality:\n  suites:\n    - {name: a, dataset: zoo:arith}\n"
    )
    served = load_manifest(base.parent / "q.yaml", ["quality.suites.0.public=true"])
    assert served.quality.suites[0].public is True
    with pytest.raises(ServegateError, match="no such list item"):
        load_manifest(base.parent / "q.yaml", ["quality.suites.3.public=true"])


def test_json_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "j", "weights": {"source": "zoo:tiny-primary"}, "batching": {"mode": "x"}}))
    with pytest.raises(ManifestError, match=r"m.json:1:\d+: batching.mode: must be one of"):
        load_manifest(path)
    path.write_text(json.dumps({"name": "j", "weights": {"source": "zoo:tiny-primary"}}, indent=2))
    assert load_manifest(path).name == "j"


def test_relative_paths_resolve_against_the_manifest(base: Path) -> None:
    served = load_manifest(base)
    assert served.resolve_path("data/x.jsonl") == base.parent.resolve() / "data/x.jsonl"
    assert served.source == base.resolve()


QUICKSTART = Path(__file__).parents[2] / "examples/quickstart/manifest.yaml"


def test_a_base_in_another_folder_keeps_its_relative_paths_and_its_fingerprint(tmp_path: Path) -> None:
    """The quickstart's fallback.yaml is the quickstart folder's, whichever folder includes the quickstart."""
    quickstart = load_manifest(QUICKSTART)
    elsewhere = tmp_path / "team" / "variants"
    elsewhere.mkdir(parents=True)
    for include in (QUICKSTART.resolve(), os.path.relpath(QUICKSTART.resolve(), elsewhere)):
        variant = elsewhere / "variant.yaml"
        variant.write_text(f"include: {include}\ndescription: the quickstart, included from another folder\n")
        served = load_manifest(variant)  # loads the fallback too: it must be found
        assert served.fingerprint == quickstart.fingerprint  # nothing behaviour-defining changed
        fallback = served.resolve_path(served.failure_policy.fallback.manifest)
        assert fallback == QUICKSTART.resolve().parent / "fallback.yaml"
        assert served.reference_form().resolve_path("fallback.yaml") == fallback  # copies resolve the same
        assert served.resolve_path("data/x.jsonl") == elsewhere / "data/x.jsonl"  # written nowhere: this folder


def test_a_path_the_variant_writes_resolves_against_the_variant(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "base.yaml").write_text(BASE + "preprocess:\n  chat_template: chat.jinja\n")
    (tmp_path / "base" / "chat.jinja").write_text("{{ messages }}")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "v.yaml").write_text("include: ../base/base.yaml\nquality:\n  suites:\n"
                                              "    - {name: own, dataset: items.jsonl}\n")  # fmt: skip
    served = load_manifest(tmp_path / "mine" / "v.yaml")
    assert served.resolve_path(served.preprocess.chat_template) == (tmp_path / "base" / "chat.jinja").resolve()
    assert served.resolve_path("items.jsonl") == (tmp_path / "mine" / "items.jsonl").resolve()


def test_one_relative_path_written_in_two_folders_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "base.yaml").write_text(BASE + "preprocess:\n  chat_template: shared.txt\n")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "v.yaml").write_text("include: ../base/base.yaml\nquality:\n  suites:\n"
                                              "    - {name: own, dataset: shared.txt}\n")  # fmt: skip
    with pytest.raises(ManifestError, match="'shared.txt' is also written at .* absolute path"):
        load_manifest(tmp_path / "mine" / "v.yaml")
    # a zoo or hub name is the same wherever it is written
    (tmp_path / "mine" / "v.yaml").write_text("include: ../base/base.yaml\nquality:\n  suites:\n"
                                              "    - {name: own, dataset: 'zoo:tiny-primary'}\n")  # fmt: skip
    assert load_manifest(tmp_path / "mine" / "v.yaml").quality.suites[0].dataset == "zoo:tiny-primary"
