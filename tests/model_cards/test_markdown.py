"""The note's Markdown renders as intended: parsed with markdown-it-py, the heading tree and tables are checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from note_evidence import make_bench, make_plan, make_report

from servegate.contracts.errors import CATALOGUE
from servegate.contracts.manifest import ServedModel
from servegate.model_cards.markdown_blocks import cell, code
from servegate.model_cards.note import ITEMS, ServingNote
from servegate.model_cards.note_files import write_note


def _tokens(text: str) -> list[Any]:
    return MarkdownIt("commonmark").enable("table").parse(text)


def _headings(tokens: list[Any]) -> list[tuple[int, str]]:
    return [(int(t.tag[1]), tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"]


def _tables(tokens: list[Any]) -> list[list[list[str]]]:
    """Every table as rows of cell texts (header row first)."""
    tables: list[list[list[str]]] = []
    row: list[str] = []
    for i, t in enumerate(tokens):
        if t.type == "table_open":
            tables.append([])
        elif t.type == "tr_open":
            row = []
        elif t.type in ("th_open", "td_open"):
            row.append(tokens[i + 1].content)
        elif t.type == "tr_close":
            tables[-1].append(row)
    return tables


@pytest.fixture
def note_text(served: ServedModel, tmp_path: Path) -> tuple[ServingNote, str]:
    report = make_report(served)
    report["gates"][2]["reason"] = "batch invariant | 0 of 64 differ\nacross sizes 1, 8, 32"
    note = write_note(served, report, tmp_path / "SERVING.md", bench=make_bench(), plan=make_plan())
    return note, (tmp_path / "SERVING.md").read_text(encoding="utf-8")


def test_heading_tree(note_text: tuple[ServingNote, str]) -> None:
    _, text = note_text
    headings = _headings(_tokens(text))
    assert headings[0] == (1, "Serving note: servegate/tiny-primary 1.0.0")
    assert [h for h in headings if h[0] == 2] == [(2, f"{n}. {title}") for n, (_, title) in enumerate(ITEMS, 1)]
    assert all(level in (1, 2, 3) for level, _ in headings)
    # Subsections sit under the right item.
    names = [name for _, name in headings]
    assert names.index("Weight checksums") < names.index("2. Input contract")
    assert (
        names.index("2. Input contract") < names.index("Errors for invalid input") < names.index("3. Output contract")
    )
    assert names.index("6. Quality gate") < names.index("Metrics") < names.index("7. Observability")


def test_tables(note_text: tuple[ServingNote, str]) -> None:
    note, text = note_text
    tables = _tables(_tokens(text))
    assert all(len({len(row) for row in t}) == 1 for t in tables), "every row has as many cells as its header"

    capacity = next(t for t in tables if t[0] == ["Metric", "Target", "Predicted", "Measured", "Met"])
    assert len(capacity) - 1 == len(note.items["capacity_target"]["rows"])
    p95 = next(r for r in capacity if r[0] == "E2E latency p95")
    assert p95 == ["E2E latency p95", "≤ 5,000.0 ms", "140.0 ms", "150.0 ms", "yes"]

    errors = next(t for t in tables if t[0][:2] == ["Code", "HTTP status"])
    client = {code for code, spec in CATALOGUE.items() if spec.client_error}
    assert {r[0] for r in errors[1:]} == {f"`{c}`" for c in client}

    gates = next(t for t in tables if t[0][0] == "Gate" and t[0][1] == "Verdict")
    batching = next(r for r in gates if r[0] == "`batching`")
    assert batching[2] == "batch invariant | 0 of 64 differ<br>across sizes 1, 8, 32"  # one cell, pipe kept

    metrics = next(t for t in tables if t[0][:3] == ["Gate", "Suite", "Metric"])
    assert ["quantization", "arith", "exact_match", "200", "0.9", "0.89", "-0.01"] == metrics[1][:7]


def test_plots_and_schemas_render(note_text: tuple[ServingNote, str]) -> None:
    _, text = note_text
    tokens = _tokens(text)
    images = [c.attrs["src"] for t in tokens if t.type == "inline" for c in t.children or [] if c.type == "image"]
    assert images == ["SERVING.latency-cdf.png", "SERVING.throughput-vs-load.png"]
    fences = [t for t in tokens if t.type == "fence" and t.info == "json"]
    assert len(fences) >= 3  # error example, request and response schemas


def test_cell_and_code_escape() -> None:
    assert cell("a|b\nc") == "a\\|b<br>c"
    assert cell(None) == "—" and cell(True) == "yes" and cell(0.123456) == "0.1235"
    assert code("x`y") == "``x`y``" and code("|") == "`\\|`"
