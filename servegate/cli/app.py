"""The `gate` command: wires the command groups; each group lives in its own module.

Known errors (bad manifest, bad usage) print one line per problem and exit 2; a gate that fails exits 1.
Set SERVEGATE_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import os
import sys

import typer

from servegate import __version__
from servegate.cli import bench, cache_key, check, deploy, manifest_commands, note, plan, profile, run, serve, zoo
from servegate.cli import eval as eval_command
from servegate.cli.process_exit import run_then_exit
from servegate.contracts.errors import ServegateError
from servegate.runtime.import_noise import silence_import_noise

# at import, not in main(): a worker process of `gate check --jobs` imports this module as its main before torch
silence_import_noise()

app = typer.Typer(
    name="gate",
    help="servegate: make model serving checkable. Manifest -> runtime -> capacity -> gates -> serving note.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

manifest_commands.register(app)
# Command groups register here, one line each, once they work:
serve.register(app)
run.register(app)
note.register(app)
check.register(app)
cache_key.register(app)
eval_command.register(app)
plan.register(app)
bench.register(app)
profile.register(app)
deploy.register(app)
app.add_typer(zoo.app, name="zoo")


@app.callback(invoke_without_command=True)
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    if version:
        typer.echo(f"servegate {__version__}")
        raise typer.Exit(0)


def main() -> None:
    """The `gate` command on `sys.argv`, ending in SystemExit with its exit status (tests call it in-process;
    the console scripts call `console_main`)."""
    try:
        app()  # standalone: typer reports usage errors itself (exit 2) and exits with the command's code
    except (ServegateError, ValueError, FileNotFoundError) as exc:
        if os.environ.get("SERVEGATE_DEBUG") == "1":
            raise
        for line in str(exc).splitlines() or [type(exc).__name__]:
            typer.echo(f"error: {line}", err=True)
        sys.exit(2)


def console_main() -> None:
    """Entry point of the `gate` and `servegate` console scripts and of `python -m servegate.cli`: `main`, then
    the process ends without the interpreter's module teardown (cli/process_exit.py)."""
    run_then_exit(main)
