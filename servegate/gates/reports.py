"""Reports of a gate check: the terminal table and progress bar, JSON, JUnit XML and Markdown."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from servegate.contracts.files import write_atomic
from servegate.gates.base import ProgressHook
from servegate.gates.result import GateReport

STYLE = {
    "pass": "bold green",
    "fail": "bold red",
    "warn": "bold yellow",
    "skipped": "dim",
    "unavailable": "bold magenta",
}


def transient_progress(console: Console, *columns: Any) -> Progress:
    """A progress bar that disappears when done; shown on a terminal only.

    Off a terminal (CI logs, a pipe) rich cannot erase the bar, and a transient one would leave a blank
    line in the output each time it stops.
    """
    return Progress(*columns, console=console, transient=True, disable=not console.is_terminal)


class RichProgress(ProgressHook):
    """A rich progress bar: one line per piece of work a gate starts (and one per worker process's gates)."""

    def __init__(self, console: Console, *, progress: Progress | None = None, label: str = "") -> None:
        self.progress = progress or transient_progress(
            console, TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
        )
        self.console = console
        self.label = label
        """Put before each description: the process a lane's work runs in."""
        self.task: Any = None

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start(self, description: str, total: int) -> None:
        """Finish the previous bar and start a new one."""
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"{self.label}{description}", total=max(total, 1))

    def advance(self, steps: int = 1) -> None:
        """Move the current bar."""
        if self.task is not None:
            self.progress.advance(self.task, steps)

    def lane(self, label: str) -> ProgressHook:
        """A second bar on the same display, its descriptions prefixed with `label`."""
        return RichProgress(self.console, progress=self.progress, label=f"[{label}] ")


def print_table(report: GateReport, console: Console) -> None:
    """The verdict table, one row per gate, with why it ran or was skipped; one line per gate off a terminal."""
    base, cand = report.baseline, report.candidate
    title = (
        f"gate check: {cand.name} {cand.version} against its reference form"
        if report.mode == "reference"
        else f"gate check: {base.name} {base.version} -> {cand.name} {cand.version}"
    )
    if not console.is_terminal:  # a CI log or a pipe: a table squeezed to 80 columns wraps each cell over lines
        console.print(title, soft_wrap=True, highlight=False, markup=False)
        for line in gate_lines(report):
            console.print(line, soft_wrap=True, highlight=False, markup=False)
        _print_summary(report, console)
        return
    table = Table(title=title, show_lines=False, title_justify="left")
    for column in ("gate", "verdict", "reason", "why", "time"):
        table.add_column(column, overflow="fold")
    for gate in report.gates:
        table.add_row(
            gate.name,
            f"[{STYLE[gate.verdict]}]{gate.verdict}[/]",
            gate.reason,
            "; ".join(gate.triggered_by) if gate.verdict != "skipped" else "",
            f"{gate.duration_s:.1f} s" if gate.verdict != "skipped" else "",
        )
    console.print(table)
    _print_summary(report, console)


def gate_lines(report: GateReport) -> list[str]:
    """One plain line per gate: name, verdict, reason, then why it ran and how long it took."""
    width = max((len(g.name) for g in report.gates), default=0)
    lines = []
    for gate in report.gates:
        line = f"{gate.name:<{width}}  {gate.verdict.upper():<7}  {gate.reason}"
        if gate.verdict != "skipped":
            why = "; ".join(gate.triggered_by)
            line += f"  ({why + ', ' if why else ''}{gate.duration_s:.1f} s)"
        lines.append(line)
    return lines


def _print_summary(report: GateReport, console: Console) -> None:
    counts = report.counts()
    summary = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    console.print(
        f"verdict: [{STYLE[report.verdict]}]{report.verdict.upper()}[/] ({summary}) in {report.duration_s:.1f} s; "
        f"candidate fingerprint {(report.candidate.fingerprint or '')[:12]}",
        soft_wrap=not console.is_terminal,
    )
    for note in report.notes:
        console.print(f"[dim]{escape(note)}[/]", soft_wrap=not console.is_terminal)


def json_text(report: GateReport) -> str:
    """The JSON report, as its schema writes it (servegate.contracts.report.check_report)."""
    return report.to_report().to_json()


def junit_xml(
    report: GateReport, strict: bool = False, *, command: str = "gate check", classname: str = "servegate.gates"
) -> str:
    """JUnit XML: one testcase per gate; a failing gate's reason is the failure message.

    Warnings are reported in system-out, and as failures under --strict; skipped gates as <skipped>; a gate
    whose engine was unavailable as an <error> (nothing was measured). `command` and `classname` name the
    suite and cases (`gate verify` writes its checks the same way).
    """
    failed = [g for g in report.gates if g.verdict == "fail" or (strict and g.verdict == "warn")]
    skipped = [g for g in report.gates if g.verdict == "skipped"]
    errored = [g for g in report.gates if g.verdict == "unavailable"]
    suites = ET.Element("testsuites", name=f"servegate {command}")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=f"{command} {report.candidate.name}",
        tests=str(len(report.gates)),
        failures=str(len(failed)),
        errors=str(len(errored)),
        skipped=str(len(skipped)),
        time=f"{report.duration_s:.3f}",
    )
    for gate in report.gates:
        case = ET.SubElement(suite, "testcase", classname=classname, name=gate.name, time=f"{gate.duration_s:.3f}")
        if gate in failed:
            failure = ET.SubElement(case, "failure", message=gate.reason, type=gate.verdict)
            record = gate.record()
            failure.text = record.model_dump_json(include={"measurements", "evidence"}, indent=2)
        elif gate in errored:
            ET.SubElement(case, "error", message=gate.reason, type="unavailable")
        elif gate.verdict == "skipped":
            ET.SubElement(case, "skipped", message=gate.reason)
        out = ET.SubElement(case, "system-out")
        out.text = f"{gate.verdict}: {gate.reason}\nwhy: {'; '.join(gate.triggered_by)}"
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def markdown_cell(text: str) -> str:
    """Text made safe for one cell of a Markdown table (pipes escaped, one line)."""
    return text.replace("|", "\\|").replace("\n", " ")


def failure_example_lines(report: GateReport) -> list[str]:
    """One Markdown bullet per failure example of a failing or warning gate (empty when there is none)."""
    examples = [(g.name, e) for g in report.gates for e in g.evidence if g.verdict in ("fail", "warn")]
    lines = []
    for name, ex in examples:
        shown = {k: v for k, v in ex.items() if v is not None}
        lines.append(f"- **{name}**: `{markdown_cell(json.dumps(shown, default=str))}`")
    return lines


def markdown(report: GateReport) -> str:
    """A Markdown summary for pull requests and release notes."""
    cand = report.candidate
    lines = [
        f"## gate check: {cand.name} {cand.version} — **{report.verdict.upper()}**",
        "",
        f"Candidate fingerprint `{cand.fingerprint}`, compared against the "
        f"{report.baseline.form} (`{(report.baseline.fingerprint or '')[:12]}`), in {report.duration_s:.1f} s.",
        "",
        "| gate | verdict | reason | why |",
        "|---|---|---|---|",
    ]
    for gate in report.gates:
        why = "; ".join(gate.triggered_by) if gate.verdict != "skipped" else ""
        lines.append(f"| {gate.name} | {gate.verdict} | {markdown_cell(gate.reason)} | {markdown_cell(why)} |")
    examples = failure_example_lines(report)
    if examples:
        lines += ["", "### Failure examples", "", *examples]
    return "\n".join(lines) + "\n"


def write_reports(
    report: GateReport, *, json_path: str | None, junit_path: Path | None, markdown_path: Path | None, strict: bool
) -> None:
    """Write the requested report files (JSON to stdout for '-')."""
    if json_path == "-":
        import sys

        sys.stdout.write(json_text(report))
        sys.stdout.flush()
    elif json_path is not None:
        write_atomic(Path(json_path), json_text(report))
    if junit_path is not None:
        write_atomic(junit_path, junit_xml(report, strict))
    if markdown_path is not None:
        write_atomic(markdown_path, markdown(report))
