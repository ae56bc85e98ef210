"""`gate check`: the release gates, from a manifest's reference form or from a baseline -> candidate change."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.table import Table

from servegate.cli.common import JsonOption, SetOption, baseline_file, console_for, load
from servegate.cli.tables import print_table
from servegate.contracts.errors import ServegateError
from servegate.gates.suites.output_cache import OutputCache, cache_dir


def _list_gates(json_out: str | None) -> None:
    from servegate.cli.common import write_json
    from servegate.gates.check import ORDER
    from servegate.gates.registry import GATES

    entries = sorted(GATES, key=lambda e: ORDER.index(e.name) if e.name in ORDER else len(ORDER))
    rows = [
        {
            "name": e.name,
            "watches": list(e.metadata["watches"]),
            "purpose": e.metadata["purpose"],
            "with_jobs": "beside others" if e.metadata.get("beside_others") else "alone",
        }
        for e in entries
    ]
    table = Table(title="gates", title_justify="left")
    for column in ("gate", "watches", "purpose", "with --jobs"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row["name"], ", ".join(row["watches"]), row["purpose"], row["with_jobs"])
    print_table(console_for(json_out), table)
    write_json(json_out, {"gates": rows})


def check(
    manifest: Annotated[Path | None, typer.Argument(help="Manifest to check against its own reference form.")] = None,
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="Baseline manifest of a change: a file, or git:REV[:PATH] (read from git)."),
    ] = None,
    candidate: Annotated[Path | None, typer.Option("--candidate", help="Candidate manifest of a change.")] = None,
    gate: Annotated[list[str] | None, typer.Option("--gate", help="Run only this gate (repeatable).")] = None,
    list_gates: Annotated[bool, typer.Option("--list", help="List the gates, what they watch, and exit.")] = False,
    set_: SetOption = None,
    json_out: JsonOption = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML (one testcase per gate).")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="Write a Markdown summary.")] = None,
    summary: Annotated[
        Path | None,
        typer.Option("--summary", help="Write the pull-request summary (GitHub Markdown, within a comment's limit)."),
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail the check too.")] = False,
    note: Annotated[
        Path | None, typer.Option("--note", help="Also write the public serving note (Markdown + JSON twin).")
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Regenerate baseline outputs instead of reusing them.")
    ] = False,
    profile_gates: Annotated[
        bool,
        typer.Option(
            "--profile-gates",
            help="After the verdicts, print where the time went per gate: model loads, reference and candidate "
            "outputs, divergence probe, timing audits, bench, other (measured).",
        ),
    ] = False,
    jobs: Annotated[
        str,
        typer.Option(
            "--jobs",
            help="Processes to run gates in at once: a number, or auto (as many as the cores hold engines at their "
            "threads and the memory holds the models). Gates that time something (capacity, caching) run alone.",
        ),
    ] = "auto",
) -> None:
    """Gate a served model: exit 0 when no gate failed, 1 when one did (or warned, with --strict), 2 on usage errors
    or when an engine a gate needed could not be reached (verdict `unavailable`).

    A single manifest is checked against its reference form (same weights and suites, every optimization
    off); --baseline/--candidate checks a change, and the diff decides which gates run. --baseline git:REV reads
    the candidate's file (or git:REV:PATH, relative to the repository root) and everything it names as they were
    at that revision, the working tree untouched; the report records the commit and blob hashes. Baseline outputs are
    cached in $SERVEGATE_CACHE (default .servegate-cache/). --set applies to the manifest or the candidate.

    Examples:
      gate check examples/quickstart/manifest.yaml
      gate check --baseline old.yaml --candidate new.yaml --junit gates.xml --json report.json
      gate check --baseline git:origin/main --candidate examples/quickstart/manifest.yaml
      gate check examples/quickstart/manifest.yaml --gate quantization
      gate check examples/quickstart/manifest.yaml --profile-gates
      gate check examples/smollm2/manifest.yaml --jobs 2
    """
    if list_gates:
        _list_gates(json_out)
        return
    if manifest is not None and (baseline is not None or candidate is not None):
        raise ServegateError("give either MANIFEST or --baseline A --candidate B, not both")
    if manifest is None and (baseline is None or candidate is None):
        raise ServegateError("give a MANIFEST, or both --baseline A and --candidate B (see gate check --help)")

    from servegate.cli.preflight import check_before_gating
    from servegate.gates.base import quiet_libraries
    from servegate.gates.check import check_manifest, run_check
    from servegate.gates.reports import RichProgress, print_table, write_reports

    quiet_libraries()

    console = console_for(json_out)
    processes = parse_jobs(jobs)
    cache = OutputCache(cache_dir(), enabled=not no_cache)
    forced = list(gate or [])
    outputs = {"--json": json_out, "--junit": junit, "--markdown": markdown, "--summary": summary}
    if manifest is not None:
        served = load(manifest, set_)
        # usage errors, unwritable outputs and a note the manifest cannot supply: all before any model loads
        check_before_gating(
            served.reference_form(), served, mode="reference", forced=forced, outputs=outputs, note=note
        )
        with RichProgress(console) as progress:
            report = check_manifest(served, forced=forced, cache=cache, progress=progress, jobs=processes)
        compared = (served.reference_form(), served)
    else:
        assert baseline is not None and candidate is not None
        with baseline_file(baseline, candidate) as (baseline_path, from_git):
            base, cand = load(baseline_path, None), load(candidate, set_)
            check_before_gating(base, cand, mode="change", forced=forced, outputs=outputs, note=note)
            with RichProgress(console) as progress:
                report = run_check(
                    base, cand, mode="change", forced=forced, cache=cache, progress=progress, jobs=processes
                )
        compared = (base, cand)
        if from_git is not None:
            report = replace(report, baseline_git=from_git, notes=[f"baseline: {from_git.summary()}", *report.notes])
    print_table(report, console)
    if profile_gates:
        from servegate.cli.time_table import print_time_split

        print_time_split(report, console)
    write_reports(report, json_path=json_out, junit_path=junit, markdown_path=markdown, strict=strict)
    if summary is not None:
        from servegate.gates.pr_summary import write_pr_summary

        full = json_out if json_out not in (None, "-") else (str(markdown) if markdown is not None else None)
        write_pr_summary(report, *compared, summary, full_report=full)
    if note is not None:  # before the exit code, so a failing check still publishes its failing verdict
        from servegate.model_cards.note_files import write_note

        write_note(cand if manifest is None else served, report, note)
        console.print(f"serving note written to {note}")
    if report.verdict == "fail" or (strict and report.warned):
        raise typer.Exit(1)
    if report.verdict == "unavailable":  # nothing was measured: a broken deployment, not an inferior model
        raise typer.Exit(2)


def parse_jobs(value: str) -> int | Literal["auto"]:
    """`--jobs`: `auto`, or a whole number of processes from 1 up; anything else is a usage error."""
    text = value.strip().lower()
    if text == "auto":
        return "auto"
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ServegateError(f"--jobs takes a whole number of processes (1 or more) or auto, not {value!r}")


def register(app: typer.Typer) -> None:
    """Add `gate check` to the root app."""
    app.command("check")(check)
