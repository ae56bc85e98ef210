"""`gate check --profile-gates` on the real runtime: after the verdicts, where the time went, with each row's kinds
adding up to its wall time (a gate's as the verdict table times it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _zoo_ready() -> bool:
    try:
        from servegate.zoo import zoo_model_path

        return (zoo_model_path("tiny-primary") / "model.safetensors").is_file()
    except Exception:
        return False


def _row(line: str) -> tuple[str, dict[str, float]]:
    """`contract | model loads: 3.21 s | other: 1.48 s | wall: 4.69 s | share: 87.5%` -> name, header -> number."""
    name, *cells = line.split(" | ")
    values = {}
    for cell in cells:
        header, value = cell.split(": ")
        values[header] = float(re.sub(r"[ s%]", "", value))
    return name, values


@pytest.mark.skipif(not _zoo_ready(), reason="the zoo models are not built")
def test_profile_gates_prints_where_the_time_went_and_the_rows_add_up(tmp_path: Path) -> None:
    env = {**os.environ, "SERVEGATE_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "servegate.cli", "check", "examples/quickstart/manifest.yaml", "--gate", "contract",
         "--profile-gates"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "where the time went" in lines, done.stdout
    start = lines.index("where the time went") + 1
    rows = dict(_row(line) for line in lines[start : start + 3])  # off a terminal: one plain line per row
    assert list(rows) == ["contract", "setup", "total"]
    assert rows["contract"]["model loads"] > 0  # the probes' servers start engines: measured, not estimated
    assert rows["contract"]["candidate outputs"] > 0  # the probes are the candidate's answers, not "other"
    for name, row in rows.items():
        kinds = {k: v for k, v in row.items() if k not in ("wall", "share")}
        # each shown figure is rounded to 0.01 s
        assert sum(kinds.values()) == pytest.approx(row["wall"], abs=0.01 * (len(kinds) + 1)), (name, row)
    assert rows["total"]["share"] == 100.0
    gate_line = next(line for line in lines if line.startswith("contract "))
    shown = float(re.search(r"([\d.]+) s\)$", gate_line).group(1))  # type: ignore[union-attr]
    assert rows["contract"]["wall"] == pytest.approx(shown, abs=0.06)  # the verdict table's time, to its 0.1 s
