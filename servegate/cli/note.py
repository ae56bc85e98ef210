"""`gate note`: write the public serving note (and a model card's Serving section) from evidence, or check one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from servegate.cli.common import JsonOption, SetOption, baseline_file, console_for, load, write_json
from servegate.contracts.errors import ServegateError
from servegate.contracts.git_revision import GitBaseline
from servegate.contracts.manifest import ServedModel

ReportOption = Annotated[Path | None, typer.Option("--report", help="Check report from `gate check MANIFEST --json`.")]
BenchOption = Annotated[Path | None, typer.Option("--bench", help="Bench result from `gate bench MANIFEST --json`.")]
PlanOption = Annotated[Path | None, typer.Option("--plan", help="Capacity plan from `gate plan MANIFEST --json`.")]
OutOption = Annotated[
    Path | None, typer.Option("-o", "--out", help="Markdown note to write (a JSON twin is written next to it).")
]
CardOption = Annotated[
    Path | None,
    typer.Option(
        "--model-card", help="Hugging Face model card (README.md) whose Serving section to insert or replace."
    ),
]
CheckOption = Annotated[
    Path | None,
    typer.Option("--check", help="Check this written note against MANIFEST instead of writing; exit 1 when stale."),
]


NoteManifestArg = Annotated[
    str | None, typer.Argument(help="Manifest file, or git:REV:PATH (read from that revision).", show_default=False)
]
CheckTrackedOption = Annotated[
    bool,
    typer.Option(
        "--check-tracked",
        help="Check every serving note git tracks against the tracked manifest of its name (the pre-commit hook).",
    ),
]


def note(
    manifest: NoteManifestArg = None,
    report: ReportOption = None,
    bench: BenchOption = None,
    plan: PlanOption = None,
    out: OutOption = None,
    model_card: CardOption = None,
    check: CheckOption = None,
    set_: SetOption = None,
    json_out: JsonOption = None,
    check_tracked: CheckTrackedOption = False,
) -> None:
    """Write the public serving note: the seven checklist items, from the manifest and what was measured.

    Examples:
      gate check examples/quickstart/manifest.yaml --json check.json
      gate bench examples/quickstart/manifest.yaml --json bench.json
      gate note examples/quickstart/manifest.yaml --report check.json --bench bench.json -o SERVING.md
      gate note examples/quickstart/manifest.yaml --report check.json -o SERVING.md --model-card README.md
      gate note --check SERVING.md examples/quickstart/manifest.yaml    # exit 1 when the note is stale
      gate note --check SERVING.md git:origin/main:examples/quickstart/manifest.yaml

    MANIFEST written git:REV:PATH (PATH relative to the repository root) is read, with every file it names, as it
    was at that revision; the working tree is untouched. --check-tracked (no MANIFEST) checks every note git tracks
    against the tracked manifests of the note's name and version, as the pre-commit hook does (docs/ci.md).
    """
    if check_tracked:
        from servegate.cli.manifest_hooks import check_tracked_notes

        if manifest is not None or check is not None:
            raise ServegateError("--check-tracked finds the notes and manifests: give neither MANIFEST nor --check")
        check_tracked_notes(json_out)
        return
    if manifest is None:
        raise ServegateError("give the MANIFEST (a file, or git:REV:PATH), or --check-tracked")
    with baseline_file(manifest, None) as (path, from_git):
        _note(load(path, set_), from_git, report, bench, plan, out, model_card, check, json_out)


def _note(
    served: ServedModel,
    from_git: GitBaseline | None,
    report: Path | None,
    bench: Path | None,
    plan: Path | None,
    out: Path | None,
    model_card: Path | None,
    check: Path | None,
    json_out: str | None,
) -> None:
    console = console_for(json_out)
    if from_git is not None:
        console.print(f"manifest: {from_git.summary()}", highlight=False)
    manifest_git = {"manifest_git": from_git.to_dict()} if from_git is not None else {}
    if check is not None:
        from servegate.model_cards.stale import check_note

        reasons = check_note(check, served)
        write_json(
            json_out,
            {"note": str(check), "fingerprint": served.fingerprint, "stale": bool(reasons), "reasons": reasons,
             **manifest_git},
        )  # fmt: skip
        if reasons:
            for reason in reasons:
                console.print(f"[red]stale[/red] {check}: {reason}", highlight=False)
            console.print("rerun `gate check` and `gate note` to refresh it", highlight=False)
            raise typer.Exit(1)
        console.print(f"[green]current[/green] {check}: fingerprint {served.fingerprint[:12]}", highlight=False)
        return
    if out is None:
        raise ServegateError("give -o SERVING.md (where to write the note), or --check SERVING.md to check one")
    from servegate.cli.preflight import output_problems, raise_problems
    from servegate.model_cards.evidence import Evidence
    from servegate.model_cards.note import twin_path
    from servegate.model_cards.note_files import check_note_path, write_note_files

    check_note_path(out)
    # every file this writes, before the evidence is read: a path that cannot take the note is said first
    raise_problems(
        output_problems(
            {"-o": out, "-o (its JSON twin)": twin_path(out), "--model-card": model_card, "--json": json_out}
        )
    )
    evidence = Evidence.from_files(report=report, bench=bench, plan=plan)
    written = write_note_files(served, evidence, out, model_card)
    for warning in written.warnings:
        console.print(f"[yellow]warning[/yellow] {warning}", highlight=False)
    files = [str(out), str(twin_path(out))] + [str(out.parent / p["path"]) for p in written.plots]
    if model_card is not None:
        files.append(str(model_card))
    write_json(
        json_out,
        {
            "note": str(out),
            "json": str(twin_path(out)),
            "fingerprint": written.fingerprint,
            "verdict": written.verdict,
            "plots": [str(out.parent / p["path"]) for p in written.plots],
            "model_card": str(model_card) if model_card else None,
            "warnings": written.warnings,
            **manifest_git,
        },
    )
    console.print(
        f"serving note for {written.title} {written.version} (gate verdict {written.verdict}):", highlight=False
    )
    for path in files:
        console.print(f"  wrote {path}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `gate note` to the root app."""
    app.command("note")(note)
