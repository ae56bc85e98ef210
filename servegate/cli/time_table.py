"""`gate check --profile-gates`: the table of where the check's time went, after the verdicts.

One row per gate that ran, then "setup" (outside every gate: suites, a remote's probe, each gate's prepare,
closing the engines, waiting for `--jobs`' workers) and "total"; a gate a worker ran is named with its process,
and each worker's own setup has a row; a column per kind of time that took any (servegate.gates.time_split). A
gate's wall time is the one the verdict table shows (timed around its run), measured apart from the split,
so a row whose kinds do not add up to it would show a hole in the accounting.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from servegate.cli.tables import print_table
from servegate.gates.result import GateReport
from servegate.gates.time_split import KINDS, SETUP, worker_setup

TITLE = "where the time went"


def _seconds(value: float) -> str:
    return f"{value:.2f} s"


def time_rows(report: GateReport) -> list[tuple[str, dict[str, float], float]]:
    """(row, kind -> seconds, wall seconds) for each gate that ran (named with its process when a worker of
    `--jobs` ran it), each worker's own setup, then the check's setup and total."""
    split = report.time_split or {}
    elsewhere = report.processes
    rows = [
        (f"{g.name} (process {elsewhere[g.name]})" if g.name in elsewhere else g.name, split[g.name], g.duration_s)
        for g in report.gates
        if g.name in split
    ]
    here_wall = sum(g.duration_s for g in report.gates if g.name in split and g.name not in elsewhere)
    workers = [worker_setup(n) for n in sorted(set(elsewhere.values()))]
    rows += [(row, split[row], sum(split[row].values())) for row in workers if row in split]
    # the check's time outside every gate of its own process (waiting for the workers included): its wall less
    # those gates' (each measured on its own)
    rows.append((SETUP, split.get(SETUP, {}), max(report.duration_s - here_wall, 0.0)))
    total = {k: sum(kinds.get(k, 0.0) for _, kinds, _ in rows) for k in KINDS}
    rows.append(("total", {k: s for k, s in total.items() if s}, report.duration_s))
    return rows


def time_table(report: GateReport) -> Table:
    """The table: a column per kind that took time anywhere, then each row's wall time and share of the check."""
    rows = time_rows(report)
    kinds = [k for k in KINDS if any(row.get(k) for _, row, _ in rows)]
    caption = "measured, exclusive: a model loaded while a suite runs counts as a model load only"
    if report.processes:
        caption += "; gates in other processes ran at the same time, so the rows add up to more than the wall"
    table = Table(title=TITLE, title_justify="left", caption=caption, caption_justify="left")
    for column in ("gate", *kinds, "wall", "share"):
        table.add_column(column, justify="left" if column == "gate" else "right")
    whole = report.duration_s or 1.0
    for name, row, wall in rows:
        cells = [_seconds(row[k]) if row.get(k) else "" for k in kinds]
        table.add_row(name, *cells, _seconds(wall), f"{wall / whole:.1%}", end_section=name == SETUP)
    return table


def print_time_split(report: GateReport, console: Console) -> None:
    """Print the table (rich on a terminal, a plain line per row elsewhere); nothing when none was measured."""
    if report.time_split is None:
        return
    print_table(console, time_table(report))
