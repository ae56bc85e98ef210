"""Options and output conventions shared by every command (defined once, used everywhere)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from servegate.contracts.files import write_atomic
from servegate.contracts.git_revision import GitBaseline, is_git_spec, manifest_from_git
from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel

ManifestArg = Annotated[Path, typer.Argument(help="Manifest file (YAML or JSON).", show_default=False)]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a field: PATH=VALUE, e.g. --set batching.mode=continuous (repeatable)."),
]
JsonOption = Annotated[
    str | None,
    typer.Option(
        "--json", help="Write the machine-readable result to PATH ('-' for stdout; the table then goes to stderr)."
    ),
]


def console_for(json_target: str | None) -> Console:
    """The console for human output: stderr when the JSON result goes to stdout. Off a terminal (a CI log, a
    pipe) a line is never wrapped at an assumed width: one printed fact stays one line (see cli/tables.py)."""
    console = Console(stderr=json_target == "-")
    console.soft_wrap = not console.is_terminal
    return console


def load(manifest: Path, sets: list[str] | None) -> ServedModel:
    """Load a manifest with the command's --set overrides (errors surface as ManifestError)."""
    return load_manifest(manifest, sets or [])


@contextmanager
def baseline_file(argument: str | Path, other: Path | None) -> Iterator[tuple[Path, GitBaseline | None]]:
    """The manifest file an argument names: itself, or with `git:REV[:PATH]` the revision's copy (PATH defaulting
    to `other`'s), kept until the block ends; the second item records what was read from git."""
    if not is_git_spec(argument):
        yield Path(argument), None
        return
    with manifest_from_git(str(argument), other) as (path, read):
        yield path, read


def write_json(target: str | None, payload: Any) -> None:
    """Write a result as JSON to a path, or to stdout for '-'; nothing when target is None."""
    if target is None:
        return
    text = json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n"
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_atomic(Path(target), text)  # a crash never leaves half a report
