"""Tables that stay readable where they land: a rich table on a terminal, one plain line per row elsewhere.

A CI log or a pipe has no width to fit, so rich squeezes a table to 80 columns and wraps every cell over
several lines, one word each. Off a terminal each row becomes one line instead: its first cell, then
`header: value` for every other non-empty cell, joined by ` | `, with no markup. `--json` stays the
machine format.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text


def _plain(cell: object) -> str:
    """A cell's text without rich markup, on one line."""
    text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
    return " ".join(text.split())


def table_lines(table: Table) -> list[str]:
    """The title (when there is one), then one line per row."""
    headers = [_plain(column.header) for column in table.columns]
    columns = [[_plain(cell) for cell in column.cells] for column in table.columns]
    lines = [_plain(table.title)] if table.title else []
    for row in zip(*columns, strict=True) if columns else ():
        first, rest = row[0], row[1:]
        parts = [first] + [f"{header}: {value}" for header, value in zip(headers[1:], rest, strict=True) if value]
        lines.append(" | ".join(p for p in parts if p))
    if table.caption:
        lines.append(_plain(table.caption))
    return lines


def print_table(console: Console, table: Table) -> None:
    """The table as rich draws it on a terminal; one line per row anywhere else (see the module doc)."""
    if console.is_terminal:
        console.print(table)
        return
    for line in table_lines(table):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
