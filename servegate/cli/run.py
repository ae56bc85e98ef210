"""`gate run`: run a JSONL file of requests through a manifest, in any batching mode, resumably."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from servegate.cli.common import JsonOption, ManifestArg, SetOption, console_for, load, write_json
from servegate.runtime.engine.offline import read_input, recover_output, run_file


def run(
    manifest: ManifestArg,
    input_path: Annotated[Path, typer.Option("--input", "-i", help="JSONL file of requests.", show_default=False)],
    output_path: Annotated[
        Path, typer.Option("--output", "-o", help="JSONL file of results (appended; a rerun resumes).")
    ],
    sets: SetOption = None,
    json_target: JsonOption = None,
) -> None:
    """Run every request of INPUT through MANIFEST and write one result line per request to OUTPUT.

    Input lines: {"id": 1, "prompt": "..."} or {"id": "a", "messages": [{"role": "user", "content": "..."}]},
    plus any completions/chat parameter (max_tokens, temperature, top_p, top_k, seed, stop, logprobs);
    defaults are the API's (temperature 1.0; a line without a seed samples as preprocess.unseeded_sampling says).
    Output lines, in input order: {"id", "text", "finish_reason", "usage"} or {"id", "error"}.

    Works in every batching mode (--set batching.mode=...); `offline` is the fastest. Killed midway,
    a rerun with the same arguments skips the ids already written and completes the file.

    Examples:

        gate run manifest.yaml --input prompts.jsonl --output results.jsonl

        gate run manifest.yaml -i prompts.jsonl -o results.jsonl --set batching.mode=offline --json -
    """
    served = load(manifest, sets)
    console = console_for(json_target)
    items = read_input(input_path)
    already = len(recover_output(output_path, {item.id for item in items}))
    columns = (
        TextColumn("[bold]gate run[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("run", total=len(items), completed=already, rate="")
        tokens = 0

        def advance(record: dict[str, object]) -> None:
            nonlocal tokens
            usage = record.get("usage")
            if isinstance(usage, dict):
                tokens += int(usage["completion_tokens"])
            elapsed = progress.tasks[0].elapsed or 0.0
            rate = f"{tokens / elapsed:.1f} output tokens/s" if elapsed > 0 else ""
            progress.update(task, advance=1, rate=rate)

        summary = asyncio.run(run_file(served, input_path, output_path, on_record=advance))
    errors = sum(summary.errors.values())
    console.print(
        f"{summary.completed} completed, {errors} errors"
        + (f" ({', '.join(f'{c}: {n}' for c, n in summary.errors.items())})" if errors else "")
        + f", {summary.skipped} already done; {summary.output_tokens} output tokens in {summary.elapsed_s:.2f} s "
        f"({summary.output_tokens_per_s:.1f} output tokens/s) -> {output_path}"
    )
    write_json(json_target, {"manifest": str(manifest), "output": str(output_path), **summary.to_json()})


def register(app: typer.Typer) -> None:
    """Add `gate run` to the CLI."""
    app.command("run")(run)
