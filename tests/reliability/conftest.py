"""The reliability tests' plugin: a `figures` fixture per test and a summary table at the end of the session.

`pytest -m reliability` (or any run that includes a test of this folder) prints every figure the tests
recorded: cases tried, requests sent / accepted / rejected / timed out / lost, kill points, cross-tenant
hits, and timing distributions. SERVEGATE_RELIABILITY_JSON=PATH also writes them as JSON.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from reliability_figures import FigureBook, TestFigures

_BOOK = pytest.StashKey[FigureBook]()


def pytest_configure(config: pytest.Config) -> None:
    """Open the session's figure book."""
    config.stash[_BOOK] = FigureBook()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Count the reliability tests that run (the table is printed only when one did)."""
    if item.get_closest_marker("reliability") is not None:
        item.config.stash[_BOOK].reliability_tests_run += 1


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> TestFigures:
    """Where this test records what it measured (printed in the session's reliability table)."""
    return request.config.stash[_BOOK].for_test(request.node.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """Print the reliability figures (and write them as JSON when asked)."""
    book = config.stash.get(_BOOK, None)
    if book is None or book.reliability_tests_run == 0:
        return
    terminalreporter.section("reliability figures")
    from reliability_engine import zoo_primary

    model = "zoo:tiny-primary" if zoo_primary() is not None else "a random tiny Llama (zoo:tiny-primary not built)"
    terminalreporter.write_line(f"model served: {model}")
    for line in book.lines() or ["(no figures recorded)"]:
        terminalreporter.write_line(line)
    target = os.environ.get("SERVEGATE_RELIABILITY_JSON")
    if target:
        book.write_json(Path(target), model=model)
        terminalreporter.write_line(f"figures written to {target}")
