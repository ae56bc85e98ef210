"""Suite loading, per-item scoring with the zoo metrics, and the on-disk cache of baseline outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servegate.contracts.errors import ServegateError
from servegate.contracts.quality_section import Suite
from servegate.gates.suites.evaluation import ItemOutput, SuiteItem, load_suite_data, make_suite_data, score_run
from servegate.gates.suites.output_cache import OutputCache, cache_dir


def _data(**suite: object):  # noqa: ANN202
    items = [SuiteItem("a", '{"a":"100","b":"200"}', '{"sum":"0300"}'), SuiteItem("b", "x", '{"sum":"0001"}')]
    schema = {"type": "object", "required": ["sum"]}
    return make_suite_data(Suite(name="j", dataset="zoo:json", metrics=["exact_match", "json_schema_valid"], **suite),
                           items, schema)  # fmt: skip


def test_items_are_scored_one_by_one_and_errors_score_zero() -> None:
    data = _data()
    outputs = [ItemOutput("a", '{"sum":"0300"}'), ItemOutput("b", None, error="deadline_exceeded")]
    assert score_run(data, outputs) == {"exact_match": [1.0, 0.0], "json_schema_valid": [1.0, 0.0]}
    outputs = [ItemOutput("a", '{"sum":"0301"}'), ItemOutput("b", "not json")]
    assert score_run(data, outputs) == {"exact_match": [0.0, 0.0], "json_schema_valid": [1.0, 0.0]}


def test_the_cache_round_trips_and_misses_on_any_change(tmp_path: Path) -> None:
    cache = OutputCache(tmp_path)
    data = _data()
    outputs = [ItemOutput("a", "t", (1, 2), truncated_tokens=3), ItemOutput("b", None, error="input_too_long")]
    assert cache.load("f" * 64, data) is None
    cache.store("f" * 64, data, outputs)
    assert cache.load("f" * 64, data) == outputs
    assert cache.load("e" * 64, data) is None  # another fingerprint
    assert cache.load("f" * 64, _data(limit=1)) is None  # another suite declaration
    assert (cache.hits, cache.misses) == (1, 3)
    assert not list(tmp_path.rglob("*.tmp"))  # written atomically, nothing left behind


def test_a_corrupt_cache_entry_is_a_miss(tmp_path: Path) -> None:
    cache, data = OutputCache(tmp_path), _data()
    cache.store("f" * 64, data, [ItemOutput("a", "t")])
    cache.path("f" * 64, data).write_text("{truncated")
    assert cache.load("f" * 64, data) is None
    cache.path("f" * 64, data).write_text(json.dumps({"format": 0}))
    assert cache.load("f" * 64, data) is None


def test_a_disabled_cache_never_reads_or_writes(tmp_path: Path) -> None:
    cache, data = OutputCache(tmp_path, enabled=False), _data()
    cache.store("f" * 64, data, [ItemOutput("a", "t")])
    assert cache.load("f" * 64, data) is None and not list(tmp_path.iterdir())


def test_the_cache_directory_follows_servegate_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SERVEGATE_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("SERVEGATE_CACHE")
    assert cache_dir() == Path(".servegate-cache")


def test_local_suites_load_relative_to_the_manifest_with_their_schema(load, manifests: Path) -> None:  # noqa: ANN001
    (manifests / "mine.jsonl").write_text('{"id": "1", "prompt": "p", "reference": "{}"}\n')
    (manifests / "mine.schema.json").write_text('{"type": "object"}')
    served = load("base.yaml")
    data = load_suite_data(served, Suite(name="mine", dataset="mine.jsonl", metrics=["json_schema_valid"]))
    assert data.items == (SuiteItem("1", "p", "{}"),) and data.schema == {"type": "object"}


def test_a_missing_suite_is_a_one_line_user_error(load) -> None:  # noqa: ANN001
    with pytest.raises(ServegateError, match=r"quality.suites\[gone\]: cannot load 'gone.jsonl'"):
        load_suite_data(load("base.yaml"), Suite(name="gone", dataset="gone.jsonl"))


def test_items_without_the_declared_fields_are_refused(load, manifests: Path) -> None:  # noqa: ANN001
    (manifests / "odd.jsonl").write_text('{"id": "1", "question": "p", "reference": "r"}\n')
    with pytest.raises(ServegateError, match=r"quality.suites\[odd\]: .*prompt"):
        load_suite_data(load("base.yaml"), Suite(name="odd", dataset="odd.jsonl"))


def test_the_cache_key_follows_the_weight_files_but_not_their_datasheet(tmp_path: Path) -> None:
    import os

    from servegate.contracts.manifest import ServedModel
    from servegate.gates.suites.output_cache import cache_key

    (tmp_path / "model.safetensors").write_bytes(b"w" * 8)
    (tmp_path / "DATASHEET.md").write_text("v1")
    served = ServedModel.model_validate({"name": "m", "weights": {"source": str(tmp_path)}})
    key = cache_key(served)
    (tmp_path / "DATASHEET.md").write_text("v2, rewritten")
    assert cache_key(served) == key
    os.utime(tmp_path / "model.safetensors", ns=(1, 1))  # a fresh checkout of the same bytes (CI)
    assert cache_key(served) == key
    (tmp_path / "model.safetensors").write_bytes(b"v" * 8)  # a retrained checkpoint, same size and time
    os.utime(tmp_path / "model.safetensors", ns=(1, 1))
    assert cache_key(served) != key
