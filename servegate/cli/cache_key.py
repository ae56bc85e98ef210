"""`gate cache-key`: the key under which CI keeps a check's baseline outputs between runs (docs/ci.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from servegate.cli.common import JsonOption, SetOption, baseline_file, load, write_json
from servegate.contracts.errors import ServegateError


def cache_key(
    manifest: Annotated[Path | None, typer.Argument(help="Manifest checked against its reference form.")] = None,
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="Baseline manifest of a change: a file, or git:REV[:PATH] (read from git)."),
    ] = None,
    candidate: Annotated[Path | None, typer.Option("--candidate", help="Candidate manifest of a change.")] = None,
    set_: SetOption = None,
    json_out: JsonOption = None,
) -> None:
    """Print the cache key of the baseline outputs `gate check` caches for the same arguments, for actions/cache
    or GitLab's cache:key. It changes with the baseline's fingerprint and weight files, the suites' declarations
    and items, the fallback, the servegate version and the engine (torch, device, vLLM version); each cached
    entry is checked against its own key when it is read, so a restored cache never feeds a wrong baseline.

    Examples:
      gate cache-key examples/quickstart/manifest.yaml
      gate cache-key --baseline git:origin/main --candidate examples/quickstart/manifest.yaml
    """
    from servegate.gates.baseline_cache import baseline_cache_key

    if manifest is not None and (baseline is not None or candidate is not None):
        raise ServegateError("give either MANIFEST or --baseline A --candidate B, not both")
    if manifest is None and (baseline is None or candidate is None):
        raise ServegateError("give a MANIFEST, or both --baseline A and --candidate B (see gate cache-key --help)")
    if manifest is not None:
        served = load(manifest, set_)
        key = baseline_cache_key(served.reference_form(), served, "reference")
    else:
        assert baseline is not None and candidate is not None
        with baseline_file(baseline, candidate) as (baseline_path, _):
            key = baseline_cache_key(load(baseline_path, None), load(candidate, set_), "change")
    if json_out is None:
        typer.echo(key.key)
        return
    if json_out != "-":
        typer.echo(key.key)
    write_json(json_out, key.to_dict())


def register(app: typer.Typer) -> None:
    """Add `gate cache-key` to the root app."""
    app.command("cache-key")(cache_key)
