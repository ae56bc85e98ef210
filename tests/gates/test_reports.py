"""The report files a CI system reads: JUnit XML (parsed back), JSON and Markdown, from a known report."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn

from servegate.gates.reports import RichProgress, json_text, junit_xml, markdown, print_table, transient_progress
from servegate.gates.result import GateReport, GateResult, Measurements, example, worst

IDENTITY = {"name": "m", "version": "1", "fingerprint": "ab" * 32, "form": "reference form", "source": ""}


@dataclass(frozen=True)
class LimitMeasurements(Measurements):
    """A gate's measurement type as the reports see it."""

    limit_tokens: int
    """The limit (tokens)."""


def _report() -> GateReport:
    failing = GateResult(
        "truncation",
        "fail",
        'recall/exact_match: inferior <by> "a lot" & more',
        LimitMeasurements(limit_tokens=24),
        [example("r1", True, suite="recall", prompt="key=AB", baseline="AB", candidate="ZZ", reference="AB")],
        ["changed: preprocess.max_input_tokens"],
        1.25,
    )
    return GateReport(
        baseline=IDENTITY,
        candidate=IDENTITY,
        gates=[
            GateResult("contract", "pass", "13 probes answered as declared", triggered_by=["every manifest"]),
            failing,
            GateResult("caching", "warn", "the warm passes never hit a cache"),
            GateResult("batching", "skipped", "no watched field changed"),
        ],
        duration_s=3.5,
    )


def test_junit_has_one_testcase_per_gate_with_the_reason_as_failure_message() -> None:
    root = ET.fromstring(junit_xml(_report()).split("\n", 1)[1])
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "1", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == ["contract", "truncation", "caching", "batching"]
    failure = cases["truncation"].find("failure")
    assert failure is not None and failure.get("message") == 'recall/exact_match: inferior <by> "a lot" & more'
    assert json.loads(failure.text or "")["measurements"] == {"limit_tokens": 24}
    assert cases["caching"].find("failure") is None  # a warning is not a failure ...
    assert "warn: the warm passes never hit a cache" in (cases["caching"].findtext("system-out") or "")
    assert cases["batching"].find("skipped") is not None
    assert cases["truncation"].get("time") == "1.250"


def test_strict_junit_fails_warnings_too() -> None:
    suite = ET.fromstring(junit_xml(_report(), strict=True).split("\n", 1)[1]).find("testsuite")
    assert suite is not None and suite.get("failures") == "2"


def test_json_has_the_documented_shape() -> None:
    data = json.loads(json_text(_report()))
    assert data["verdict"] == "fail" and data["fingerprint"] == "ab" * 32
    assert [g["name"] for g in data["gates"]] == ["contract", "truncation", "caching", "batching"]
    assert all({"name", "verdict", "reason", "measurements"} <= set(g) for g in data["gates"])
    assert data["counts"] == {"pass": 1, "fail": 1, "warn": 1, "skipped": 1, "unavailable": 0}


def test_markdown_lists_verdicts_and_the_failure_examples() -> None:
    text = markdown(_report())
    assert "**FAIL**" in text
    assert "| truncation | fail | recall/exact_match: inferior" in text
    assert '"candidate": "ZZ"' in text


def test_private_examples_carry_only_ids_and_lengths() -> None:
    private = example("7", False, suite="s", prompt="secret prompt", baseline="secret", candidate="other")
    assert private == {"suite": "s", "id": "7", "prompt_chars": 13, "baseline_chars": 6, "candidate_chars": 5}


def test_worst_orders_verdicts() -> None:
    assert worst(["pass", "warn", "skipped"]) == "warn"
    assert worst(["pass", "fail", "warn"]) == "fail"
    assert worst([]) == "skipped"


def _run_bars(console: Console) -> None:
    with transient_progress(console, BarColumn()) as bar:
        task = bar.add_task("x", total=3)
        bar.advance(task)
    with RichProgress(console) as progress:
        progress.start("gate", 2)
        progress.advance()


def test_progress_bars_leave_nothing_in_a_log() -> None:
    """Off a terminal the bars are off: lines printed around them are not separated by blank lines."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=False)
    console.print("before")
    _run_bars(console)
    console.print("after")
    assert out.getvalue() == "before\nafter\n"


def test_progress_bars_draw_on_a_terminal() -> None:
    """On a terminal the bars are drawn (and erased: transient)."""
    out = io.StringIO()
    _run_bars(Console(file=out, force_terminal=True, width=60))
    assert "\x1b[" in out.getvalue()


def test_off_a_terminal_the_verdicts_are_one_line_per_gate_however_long() -> None:
    """A CI log gets one greppable line per gate, never an 80-column table whose cells wrap over five lines."""
    report = _report()
    report.gates[0].reason = "a reason long enough to wrap in any table of eighty columns " * 3
    out = io.StringIO()
    print_table(report, Console(file=out, force_terminal=False, width=80))
    lines = out.getvalue().splitlines()
    assert lines[0] == "gate check: m 1 against its reference form"
    assert lines[1] == f"contract    PASS     {report.gates[0].reason}  (every manifest, 0.0 s)"
    assert lines[2] == ('truncation  FAIL     recall/exact_match: inferior <by> "a lot" & more  '
                        "(changed: preprocess.max_input_tokens, 1.2 s)")  # fmt: skip
    assert lines[4] == "batching    SKIPPED  no watched field changed"
    assert lines[5].startswith("verdict: FAIL (1 pass, 1 fail, 1 warn, 1 skipped) in 3.5 s")
    assert len(lines) == 6 and not any(c in out.getvalue() for c in "│┃━─")


def test_on_a_terminal_the_verdicts_are_a_table() -> None:
    out = io.StringIO()
    print_table(_report(), Console(file=out, force_terminal=True, width=120, color_system=None))
    assert "┃ gate" in out.getvalue() and "│ truncation" in out.getvalue()
