"""Off a terminal every table prints one line per row (a CI log never gets one-word wrapped cells)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from servegate.cli.tables import print_table, table_lines

ROOT = Path(__file__).resolve().parents[2]


def test_a_row_is_its_first_cell_then_each_other_cell_with_its_header() -> None:
    table = Table(title="candidate policies (2 tried)")
    for column in ("policy", "max_batch_size", "e2e p99", "why"):
        table.add_column(column)
    table.add_row("continuous", "32", "[green]812 ms[/]", "")
    table.add_row("static", "8", "1,204 ms", "misses the p99 target by a long way, which is a long reason")
    assert table_lines(table) == [
        "candidate policies (2 tried)",
        "continuous | max_batch_size: 32 | e2e p99: 812 ms",
        "static | max_batch_size: 8 | e2e p99: 1,204 ms | why: misses the p99 target by a long way, which is a long "
        "reason",
    ]


def test_a_terminal_still_gets_the_drawn_table(tmp_path: Path) -> None:
    table = Table(title="t")
    table.add_column("a")
    table.add_row("x")
    with (tmp_path / "out").open("w") as handle:
        print_table(Console(file=handle, force_terminal=True, width=40), table)
    assert "┏" in (tmp_path / "out").read_text()


def test_gate_validate_in_a_ci_log_is_one_line_per_element() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "servegate.cli", "validate", "examples/quickstart/manifest.yaml"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    elements = ("weights", "preprocess", "runtime", "batching", "postprocess", "failure_policy", "quality")
    for element in elements:
        [line] = [x for x in lines if x.startswith(f"{element} | declared: ")]
        assert len(line) > 40  # the whole description on its line, however narrow the log
    assert not any(c in done.stdout + done.stderr for c in "┃│┏")
