"""The pull-request summary of a gate check (`gate check --summary FILE`): GitHub-flavoured Markdown for a PR
comment and `$GITHUB_STEP_SUMMARY`, within GitHub's comment limit.

It gives the verdict line, one row per gate with its deciding figure and interval (`headline_figures.py`), what
changed between the two manifests, then each gate's measurements and the failure examples in collapsed
`<details>`. When the whole does not fit in `limit` bytes, the details go first, then rows of the diff, and a
last line says where the full report is (the JSON report's path, and the CI run's page when the environment
names one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servegate.contracts.diff import diff_report
from servegate.contracts.files import write_atomic
from servegate.contracts.manifest import ServedModel
from servegate.gates.headline_figures import headline
from servegate.gates.registry import gate_watches
from servegate.gates.reports import failure_example_lines, json_text, markdown_cell
from servegate.gates.result import GateReport

GITHUB_COMMENT_LIMIT = 65536
"""The most characters GitHub takes in an issue or pull-request comment; the summary is kept within as many
UTF-8 bytes, which no character count exceeds."""
MARKER = "<!-- servegate-pr-summary -->"
"""First line of every summary: a CI step finds its own earlier comment by it and edits it instead of adding one."""
WORD = {"pass": "pass", "fail": "**FAIL**", "warn": "warn", "skipped": "skipped", "unavailable": "**unavailable**"}
REASON_CHARS = 300
"""A gate's reason is cut to this many characters in the table (the details and the full report keep it whole)."""


def run_page(environ: Mapping[str, str] = os.environ) -> str | None:
    """The CI run's page, where its artifacts (the full report) are: GitHub Actions' run, or GitLab's job."""
    server, repo, run = (environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    if server and repo and run:
        return f"{server}/{repo}/actions/runs/{run}"
    return environ.get("CI_JOB_URL") or None


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _verdict_line(report: GateReport, data: dict[str, Any]) -> list[str]:
    cand, base = data["candidate"], data["baseline"]
    ran = [g for g in report.gates if g.verdict != "skipped"]
    failed = [g.name for g in report.gates if g.verdict in ("fail", "unavailable")]
    warned = [g.name for g in report.gates if g.verdict == "warn"]
    outcome = (
        f"{len(failed)} of {len(ran)} gate(s) run failed: {', '.join(failed)}"
        if failed
        else (f"all {len(ran)} gate(s) run passed" if ran else "no gate ran: nothing the gates watch changed")
    )
    if warned:
        outcome += f"; warned: {', '.join(warned)}"
    against = (
        f"its reference form (`{str(base['fingerprint'])[:12]}`)"
        if data["mode"] == "reference"
        else f"{base['name']} {base['version']} (`{str(base['fingerprint'])[:12]}`)"
    )
    source = f"\n\nBaseline: {report.baseline_git.summary()}." if report.baseline_git is not None else ""
    return [
        MARKER,
        f"### gate check: {cand['name']} {cand['version']}: **{report.verdict.upper()}**",
        "",
        f"{outcome}. Candidate `{str(cand['fingerprint'])[:12]}` against {against}, in {report.duration_s:.1f} s."
        + source,
    ]


def _gate_table(report: GateReport, measurements: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["", "| gate | verdict | figure | interval | reason |", "|---|---|---|---|---|"]
    skipped = []
    for gate in report.gates:
        if gate.verdict == "skipped":
            skipped.append(gate.name)
            continue
        fig = headline(measurements.get(gate.name, {}))
        reason = gate.reason if len(gate.reason) <= REASON_CHARS else gate.reason[: REASON_CHARS - 1] + "…"
        cells = (gate.name, WORD[gate.verdict], fig.figure, fig.interval, reason)
        lines.append("| " + " | ".join(markdown_cell(c) for c in cells) + " |")
    if skipped:
        lines += ["", f"Skipped: {', '.join(skipped)}."]
    return lines


def _value(value: Any) -> str:
    return "(absent)" if value is None else f"`{markdown_cell(json.dumps(value, default=str))}`"


def _change_rows(changes: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    return [
        f"| {markdown_cell(c['path'])} | {_value(c['old'])} | {_value(c['new'])} | {', '.join(c['gates']) or '-'} |"
        for element in changes.values()
        for c in element
    ]


def _details(report: GateReport, measurements: dict[str, dict[str, Any]]) -> list[list[str]]:
    """One collapsed block per gate that ran (its reason, why it ran and its measurements), then the examples.
    The JSON is fenced with four backticks, so a measured text holding three cannot end the block."""
    blocks = []
    for gate in report.gates:
        if gate.verdict == "skipped":
            continue
        shown = json.dumps(measurements.get(gate.name, {}), indent=1, default=str)
        blocks.append([
            "", f"<details><summary>{gate.name}: {gate.verdict}</summary>", "",
            markdown_cell(gate.reason), "", f"Ran because: {markdown_cell('; '.join(gate.triggered_by))}", "",
            "````json", shown, "````", "", "</details>",
        ])  # fmt: skip
    examples = failure_example_lines(report)
    if examples:
        blocks.append(["", "<details><summary>failure examples</summary>", "", *examples, "", "</details>"])
    return blocks


def pr_summary(
    report: GateReport,
    changes: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    full_report: str | None = None,
    environ: Mapping[str, str] = os.environ,
    limit: int = GITHUB_COMMENT_LIMIT,
) -> str:
    """The summary of `report`; `changes` is the manifest diff by element (`contracts.diff.diff_report`'s
    `changes`), `full_report` where the whole report is written (the JSON path). At most `limit` UTF-8 bytes."""
    data = json.loads(json_text(report))
    measurements = {g["name"]: g.get("measurements") or {} for g in data["gates"]}
    page = run_page(environ)
    where = " and ".join(w for w in (f"`{full_report}`" if full_report else "", page and f"[the CI run]({page})") if w)
    tail = [
        "",
        f"_Cut to fit a comment: the full report is {where or 'the --json report of this check'}._",
    ]
    head = _verdict_line(report, data) + _gate_table(report, measurements)
    title = "What changed" if data["mode"] == "change" else "What the manifest changes from its reference form"
    diff_head = ["", f"#### {title}", "", "| field | baseline | candidate | gates |", "|---|---|---|---|"]
    rows = _change_rows(changes) or None
    blocks = _details(report, measurements)
    text = "\n".join(head + (diff_head + rows if rows else ["", "No manifest field changed."]))
    budget = limit - _size("\n".join(tail)) - 2
    if _size(text) > budget:  # the table alone is too long: cut it at a line
        kept: list[str] = []
        for line in text.split("\n"):
            if _size("\n".join([*kept, line])) > budget:
                break
            kept.append(line)
        return "\n".join(kept + tail) + "\n"
    cut = False
    for block in blocks:
        joined = "\n".join(block)
        if _size(text) + 1 + _size(joined) > budget:
            cut = True
            continue
        text += "\n" + joined
    footer = tail if cut else (["", f"Full report: {where}."] if where else [])
    return "\n".join([text, *footer]) + "\n"


def write_pr_summary(
    report: GateReport, baseline: ServedModel, candidate: ServedModel, path: Path, *, full_report: str | None
) -> None:
    """Write the summary of `report` to `path`, with the diff of the two manifests the check compared."""
    changes = diff_report(baseline, candidate, gate_watches())["changes"]
    write_atomic(path, pr_summary(report, changes, full_report=full_report))
