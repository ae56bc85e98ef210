"""What servegate derives from a GGUF file is derived once per file's bytes and kept whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from servegate.runtime.model import gguf_kept
from servegate.runtime.model.checkpoint_scheme import read_scheme


def write_gguf(path: Path, name: str = "tiny") -> Path:
    """A header-only llama GGUF with one float32 tensor, its `general.name` set to `name`."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_block_count(2)
    writer.add_context_length(64)
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_the_header_is_read_once_then_from_what_was_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gguf

    path = write_gguf(tmp_path / "m.gguf")
    first = gguf_kept.gguf_fields(path)
    assert first.get("general.architecture") == "llama" and first.get("llama.block_count") == 2
    assert first.tensor_types == {"F32": 1}
    assert first.tensor_bytes == first.linear_bytes == 4 * 8 * 4  # one 4 x 8 float32 block matrix

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the header was parsed again")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    again = gguf_kept.gguf_fields(path)
    assert again == first
    assert read_scheme(tmp_path, "gguf").storage == "F32 x1"  # the scheme reads the kept header too


def test_another_file_or_the_same_bytes_elsewhere(tmp_path: Path, home: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = write_gguf(tmp_path / "a" / "m.gguf", "one")
    twin = tmp_path / "b" / "m.gguf"
    twin.write_bytes(one.read_bytes())
    other = write_gguf(tmp_path / "other.gguf", "two")
    assert gguf_kept.gguf_key(one) == gguf_kept.gguf_key(twin)  # the key is the bytes, not the path
    assert gguf_kept.gguf_key(one) != gguf_kept.gguf_key(other)
    assert gguf_kept.gguf_fields(other).get("general.name") == "two"
    assert gguf_kept.gguf_fields(twin).get("general.name") == "one"
    assert sorted(p.name for p in (home / "gguf").iterdir()) == sorted(
        {gguf_kept.gguf_key(one), gguf_kept.gguf_key(other)}
    )


def test_a_derivation_that_fails_leaves_nothing_and_the_next_one_derives(tmp_path: Path, home: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    part = home / "gguf" / gguf_kept.gguf_key(path) / "part"

    def crash(out: Path) -> None:
        (out / "half.json").write_text("{", encoding="utf-8")
        raise RuntimeError("killed halfway")

    with pytest.raises(RuntimeError):
        gguf_kept._kept(path, "part", crash)
    assert not part.exists() and list(part.parent.iterdir()) == []  # no half part, no scratch left

    calls: list[Path] = []

    def derive(out: Path) -> None:
        calls.append(out)
        (out / "whole.json").write_text("{}", encoding="utf-8")

    assert gguf_kept._kept(path, "part", derive) == part
    assert gguf_kept._kept(path, "part", derive) == part
    assert len(calls) == 1 and [p.name for p in part.iterdir()] == ["whole.json"]


def test_a_part_another_process_kept_first_wins(tmp_path: Path, home: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    part = home / "gguf" / gguf_kept.gguf_key(path) / "part"

    def race(out: Path) -> None:  # while this one derives, another process lands its copy
        (out / "mine.json").write_text("{}", encoding="utf-8")
        part.mkdir(parents=True)
        (part / "theirs.json").write_text("{}", encoding="utf-8")

    assert gguf_kept._kept(path, "part", race) == part
    assert [p.name for p in part.iterdir()] == ["theirs.json"]
    assert sorted(p.name for p in part.parent.iterdir()) == ["part"]


def test_a_file_that_is_not_gguf_is_one_line(tmp_path: Path) -> None:
    from servegate.contracts.errors import ServegateError

    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ServegateError, match="is not a GGUF file servegate can read"):
        gguf_kept.gguf_fields(bad)
    with pytest.raises(ServegateError, match="no GGUF file at"):
        gguf_kept.gguf_fields(tmp_path / "absent.gguf")


def test_a_conversion_made_elsewhere_is_kept_by_links_and_never_redone(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import servegate.zoo.fetch as fetch

    path = write_gguf(tmp_path / "m.gguf")
    converted = tmp_path / "converted"
    converted.mkdir()
    for name in ("model.safetensors", "config.json", "DATASHEET.md"):
        (converted / name).write_text(name, encoding="utf-8")
    kept = gguf_kept.keep_conversion(path, converted, ["model.safetensors", "config.json"])
    assert sorted(p.name for p in kept.iterdir()) == ["config.json", "model.safetensors"]
    assert (kept / "model.safetensors").samefile(converted / "model.safetensors")  # a link, not a second copy

    def refuse(*args: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(fetch, "convert_gguf", refuse)
    assert gguf_kept.gguf_checkpoint_dir(path) == kept


def test_a_home_that_cannot_hold_the_parts_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from servegate.contracts.errors import ServegateError

    path = write_gguf(tmp_path / "m.gguf")
    (tmp_path / "home-file").write_text("a file, not a folder", encoding="utf-8")
    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path / "home-file"))
    with pytest.raises(ServegateError, match="set SERVEGATE_HOME to a writable folder"):
        gguf_kept.gguf_fields(path)
