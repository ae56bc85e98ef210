"""write_atomic: the whole file or the old one, never half; folders made, permissions kept, nothing left over."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from servegate.contracts.files import write_atomic


def test_text_and_bytes_land_whole_in_a_new_folder(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "report.json"
    assert write_atomic(target, "héllo\n") == target
    assert target.read_bytes() == "héllo\n".encode()
    write_atomic(target, b"\x89PNG")
    assert target.read_bytes() == b"\x89PNG"
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]  # no partial file left


def test_a_replaced_file_keeps_its_permissions(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text("name: a\n")
    manifest.chmod(0o640)
    write_atomic(manifest, "name: b\n")
    assert stat.S_IMODE(manifest.stat().st_mode) == 0o640 and manifest.read_text() == "name: b\n"


def test_a_write_that_fails_leaves_the_old_file_and_no_partial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "note.md"
    target.write_text("old")

    def broken(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk gone"):
        write_atomic(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["note.md"]


def test_a_mode_sets_the_permissions_of_the_written_file(tmp_path: Path) -> None:
    import stat

    script = write_atomic(tmp_path / "probe.py", "print(1)\n", mode=0o755)
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    plain = write_atomic(tmp_path / "notes.md", "x\n")
    assert stat.S_IMODE(plain.stat().st_mode) & 0o111 == 0
