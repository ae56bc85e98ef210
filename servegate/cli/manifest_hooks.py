"""What the pre-commit hooks run (`.pre-commit-hooks.yaml`, docs/ci.md): `gate validate` over every changed file,
`gate fingerprint --check` against a committed fingerprint, and the `--check-tracked` forms that find every
tracked fingerprint file and serving note with the manifest each belongs to."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from servegate.cli.common import console_for, write_json
from servegate.contracts.errors import ServegateError
from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.contracts.manifest_detection import manifest_file_problem

ValidateOne = Callable[[Path, "list[str] | None", Console], "dict[str, Any]"]
FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")


def validate_files(
    paths: list[Path],
    sets: list[str] | None,
    json_out: str | None,
    *,
    manifests_only: bool,
    validate_one: ValidateOne,
) -> None:
    """Validate every manifest of `paths` (with --manifests-only, skipping the files that are not manifests), print
    each problem as `error: FILE: ...`, and exit 2 when any manifest is invalid."""
    console = console_for(json_out)
    valid: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    invalid: list[dict[str, str]] = []
    for path in paths:
        why_not = manifest_file_problem(path) if manifests_only else None
        if why_not is not None:
            skipped.append({"path": str(path), "reason": why_not})
            console.print(f"skipped {escape(str(path))}: not a manifest ({escape(why_not)})", highlight=False)
            continue
        try:
            valid.append({"path": str(path), **validate_one(path, sets, console)})
        except (ServegateError, ValueError, FileNotFoundError) as exc:
            invalid.append({"path": str(path), "error": str(exc)})
            for line in str(exc).splitlines() or [type(exc).__name__]:
                typer.echo(f"error: {path}: {line}", err=True)
    write_json(json_out, {"valid": not invalid, "manifests": valid, "invalid": invalid, "skipped": skipped})
    if invalid:
        raise typer.Exit(2)


def recorded_fingerprint(path: Path) -> str:
    """The fingerprint a committed file records: its first line that is not blank or a `#` comment (what
    `gate fingerprint M > FILE` writes), or the `fingerprint` of a JSON object (`gate fingerprint --json`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ServegateError(
            f"{path}: no such fingerprint file: write it with gate fingerprint MANIFEST > {path}"
        ) from None
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text).get("fingerprint")
        except (ValueError, AttributeError):
            value = None
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        value = lines[0] if lines else None
    if not isinstance(value, str) or not FINGERPRINT.match(value):
        raise ServegateError(f"{path}: records no fingerprint (64 hex digits on its first line, or JSON's fingerprint)")
    return value


def check_fingerprint(served: ServedModel, manifest: Path, committed: Path, json_out: str | None) -> None:
    """Compare `served`'s fingerprint with the one `committed` records; exit 1 (saying how to refresh) when stale."""
    recorded = recorded_fingerprint(committed)
    same = recorded == served.fingerprint
    console = console_for(json_out)
    write_json(
        json_out,
        {"manifest": str(manifest), "file": str(committed), "fingerprint": served.fingerprint,
         "recorded": recorded, "current": same},
    )  # fmt: skip
    if same:
        console.print(f"current {committed}: fingerprint {served.fingerprint[:12]}", highlight=False)
        return
    console.print(
        f"stale {committed}: it records {recorded[:12]}, {manifest} is now {served.fingerprint[:12]} (its served "
        f"behaviour changed); if that is intended: gate fingerprint {manifest} > {committed}",
        highlight=False,
        soft_wrap=True,
    )
    raise typer.Exit(1)


def tracked_files() -> list[Path]:
    """The files git tracks (the index, so a file staged for the commit counts) under the current directory."""
    try:
        done = subprocess.run(["git", "ls-files", "-z"], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise ServegateError("git is not installed (not on PATH): name the files to check instead") from None
    if done.returncode != 0:
        raise ServegateError(f"{Path.cwd()} is not in a git repository: name the files to check instead")
    return [Path(name) for name in done.stdout.split("\0") if name and Path(name).is_file()]


def _beside(fingerprint_file: Path) -> Path | None:
    """The manifest a committed fingerprint file belongs to: the same name with .yaml, .yml or .json."""
    for suffix in (".yaml", ".yml", ".json"):
        if (candidate := fingerprint_file.with_suffix(suffix)).is_file():
            return candidate
    return None


def check_tracked_fingerprints(json_out: str | None) -> None:
    """Check every tracked `NAME.fingerprint` against the manifest beside it (NAME.yaml, .yml or .json); exit 1
    when one is stale, 2 when one has no manifest or records no fingerprint."""
    console = console_for(json_out)
    results: list[dict[str, Any]] = []
    for committed in (p for p in tracked_files() if p.suffix == ".fingerprint"):
        manifest = _beside(committed)
        try:
            if manifest is None:
                raise ServegateError(f"{committed}: no manifest beside it ({committed.with_suffix('.yaml')})")
            recorded, current = recorded_fingerprint(committed), load_manifest(manifest).fingerprint
        except (ServegateError, ValueError) as exc:
            results.append({"file": str(committed), "error": str(exc)})
            typer.echo(f"error: {exc}", err=True)
            continue
        results.append({"file": str(committed), "manifest": str(manifest), "recorded": recorded, "fingerprint": current,
                        "current": recorded == current})  # fmt: skip
        if recorded == current:
            console.print(f"current {committed}: fingerprint {current[:12]}", highlight=False)
        else:
            console.print(
                f"stale {committed}: it records {recorded[:12]}, {manifest} is now {current[:12]}; if the change is "
                f"intended: gate fingerprint {manifest} > {committed}",
                highlight=False,
            )
    if not results:
        console.print("no tracked *.fingerprint file: nothing to check", highlight=False)
    write_json(json_out, {"fingerprints": results})
    if any("error" in r for r in results):
        raise typer.Exit(2)
    if not all(r["current"] for r in results):
        raise typer.Exit(1)


def _notes(files: list[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """Every tracked serving note with its metadata: a Markdown note (its `servegate-note` line), or a JSON note
    whose Markdown twin is not tracked."""
    from servegate.model_cards.render_markdown import META_PREFIX
    from servegate.model_cards.stale import read_note_metadata

    notes = []
    markdown = {p.with_suffix(".json") for p in files if p.suffix == ".md"}
    for path in files:
        if path.suffix == ".md" and META_PREFIX not in path.read_text(encoding="utf-8", errors="replace"):
            continue
        if path.suffix not in (".md", ".json") or path in markdown:
            continue
        try:
            meta = read_note_metadata(path)
        except (ServegateError, ValueError):
            continue
        if isinstance(meta, dict) and {"fingerprint", "name", "gate_results_at"} <= set(meta):
            notes.append((path, meta))
    return notes


def check_tracked_notes(json_out: str | None) -> None:
    """Check every tracked serving note against the tracked manifests of its name and version: current when one of
    them serves the note's fingerprint and has not changed since; exit 1 when a note is stale."""
    from servegate.model_cards.stale import stale_reasons

    console = console_for(json_out)
    files = tracked_files()
    reasons: list[str]
    manifests: dict[tuple[str, str], list[tuple[Path, ServedModel]]] = {}
    for path in (p for p in files if p.suffix in (".yaml", ".yml", ".json")):
        if manifest_file_problem(path) is None:
            try:
                served = load_manifest(path)
            except (ServegateError, ValueError):
                continue  # an invalid manifest is the validate hook's finding
            manifests.setdefault((served.name, served.version), []).append((path, served))
    results: list[dict[str, Any]] = []
    for note, meta in _notes(files):
        named = manifests.get((str(meta["name"]), str(meta.get("version"))), [])
        # the manifest of the note's fingerprint when one serves it, else the only one of its name
        chosen = [(p, s) for p, s in named if s.fingerprint == meta["fingerprint"]]
        chosen = chosen or (named if len(named) == 1 else [])
        manifest = str(chosen[0][0]) if chosen else None
        if chosen:
            reasons = stale_reasons(meta, chosen[0][1])
        else:
            serving = ", ".join(f"{p}: {s.fingerprint[:12]}" for p, s in named) or "none"
            reasons = [
                f"no tracked manifest named {meta['name']} {meta.get('version')} serves its fingerprint "
                f"{str(meta['fingerprint'])[:12]} (of that name: {serving})"
            ]
        results.append({"note": str(note), "manifest": manifest, "stale": bool(reasons), "reasons": reasons})
        for reason in reasons:
            console.print(f"stale {note}: {reason}", highlight=False)
        if not reasons:
            console.print(f"current {note}: {manifest}, fingerprint {str(meta['fingerprint'])[:12]}", highlight=False)
    if not results:
        console.print("no tracked serving note: nothing to check", highlight=False)
    write_json(json_out, {"notes": results})
    if any(r["stale"] for r in results):
        console.print("rerun `gate check` and `gate note` to refresh it", highlight=False)
        raise typer.Exit(1)
