"""`gate export` and `gate verify`: the manifest as the source of a deployment, and drift caught in production."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from servegate.cli.common import JsonOption, ManifestArg, SetOption, console_for, load, write_json
from servegate.cli.tables import print_table
from servegate.contracts.files import write_atomic

if TYPE_CHECKING:
    from rich.console import Console

    from servegate.contracts.residual import ExportPlan

STYLE = {"pass": "bold green", "fail": "bold red", "skipped": "dim"}


def export(
    manifest: ManifestArg,
    target: Annotated[
        str, typer.Option("--target", "-t", help="vllm, ray-serve, kserve or llamacpp.", show_default=False)
    ],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Folder to write (default out/export/TARGET).")
    ] = None,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict", help="Refuse (exit 1, nothing written) when the target would change a declared behaviour."
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model path or URI as the deployment sees it (default: from weights.source)."),
    ] = None,
    replicas: Annotated[
        int, typer.Option("--replicas", help="Replicas (the floor when autoscaling); Ray Serve and KServe.")
    ] = 1,
    max_replicas: Annotated[
        int | None, typer.Option("--max-replicas", help="Autoscale up to this many replicas; Ray Serve and KServe.")
    ] = None,
    set_: SetOption = None,
    json_out: JsonOption = None,
) -> None:
    """Write a target's own files from the manifest, plus RESIDUAL.md / residual.json: what they cannot express.

    Targets: `vllm` (config.yaml for `vllm serve --config`, vllm.env), `ray-serve` (a Serve config whose
    LLMConfig engine_kwargs are vLLM's arguments), `kserve` (an LLMInferenceService), `llamacpp` (llama-server.sh:
    llama-server's command line for the manifest's GGUF, --model being the .gguf path). Every export also
    writes readiness_probe.py (the warm-up checks) and weights.sha256 (its checksums). The vLLM config is checked with
    vLLM's own parser when vLLM is installed ($SERVEGATE_VLLM_PYTHON or .venvs/vllm), against vLLM 0.32's
    option list otherwise. Exit 1 with --strict when a field would be served with another value.

    Examples:
      gate export examples/quickstart/manifest.yaml --target vllm -o deploy/vllm
      gate export manifest.yaml --target kserve --model hf://org/model --max-replicas 4 --strict
    """
    from servegate.contracts.errors import ServegateError
    from servegate.deploy.targets import TARGETS, Deployment, export_manifest, write_export

    if target not in TARGETS:
        raise ServegateError(f"--target must be one of {', '.join(TARGETS)} (got {target!r})")
    console = console_for(json_out)
    served = load(manifest, set_)
    plan = export_manifest(served, target, Deployment(model=model, replicas=replicas, max_replicas=max_replicas))
    _print_residuals(plan, console)
    changes = plan.behaviour_changes
    if strict and changes:
        for change in sorted(changes, key=lambda r: r.field):
            console.print(f"[bold red]behaviour change[/]: {change.field} = {change.value!r}: {change.reason}")
        console.print(f"export refused (--strict): {len(changes)} behaviour change(s); nothing written")
        write_json(json_out, {"written": [], **plan.to_dict()})
        raise typer.Exit(1)
    out_dir = output or Path("out") / "export" / target
    written = write_export(plan, out_dir)
    check_line = _check_config(out_dir, target)
    console.print(f"wrote {len(written)} files to {out_dir}: {', '.join(p.name for p in written)}")
    if check_line:
        console.print(check_line)
    write_json(json_out, {"written": [str(p) for p in written], **plan.to_dict()})


def _check_config(out_dir: Path, target: str) -> str | None:
    from servegate.contracts.errors import ServegateError
    from servegate.deploy.vllm_config_check import check_vllm_config

    if target != "vllm":
        return None
    result = check_vllm_config(out_dir / "config.yaml")
    if not result.ok:
        raise ServegateError(f"{out_dir / 'config.yaml'}: " + "; ".join(result.problems))
    how = (
        "vLLM's own argument parser" if result.method == "vllm-parser" else "the option list (vLLM not installed here)"
    )
    return f"config.yaml checked with {how}, vLLM {result.vllm_version}"


def _print_residuals(plan: ExportPlan, console: Console) -> None:
    table = Table(title=f"gate export: {plan.identity['name']} -> {plan.target}: not expressed", title_justify="left")
    for column in ("field", "status", "enforced by", "gates"):
        table.add_column(column, overflow="fold")
    for r in plan.sorted_residuals():
        status = "[bold yellow]behaviour change[/]" if r.status == "behaviour_change" else "residual"
        table.add_row(r.field, status, r.enforced_by, ", ".join(r.gates))
    print_table(console, table)


def verify(
    manifest: ManifestArg,
    url: Annotated[
        str,
        typer.Option(
            "--url", help="Base URL of the deployment (http://HOST:PORT, with or without /v1).", show_default=False
        ),
    ],
    engine: Annotated[
        str | None, typer.Option("--engine", help="Engine name expected (default: runtime.engine.name).")
    ] = None,
    engine_version: Annotated[
        str | None,
        typer.Option(
            "--engine-version", help="Engine version expected, e.g. 0.32.0 (default: runtime.engine.version)."
        ),
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per request.")] = 30.0,
    set_: SetOption = None,
    json_out: JsonOption = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML (one testcase per check).")] = None,
) -> None:
    """Check a live deployment against the manifest, without load: exit 0 on match, 1 on drift, 2 when unreachable.

    Reads /v1/models (model id, max_model_len), the engine and its version (/version on vLLM, /info or the
    server header elsewhere), vLLM's cache configuration in /metrics (block size, cache dtype, prefix
    caching, KV budget and blocks); sends the warm-up prompts (greedy, text compared) and a few invalid
    inputs (over-long prompt, unknown field) whose answers the manifest declares. Each mismatch names the
    manifest field. Fit for a readiness probe or a cron job (docs/deployment.md).

    Examples:
      gate verify examples/quickstart/manifest.yaml --url http://127.0.0.1:8000
      gate verify manifest.yaml --url http://vllm:8000 --engine-version 0.32.0 --junit verify.xml --json -
    """
    from servegate.deploy.verify import verify_deployment
    from servegate.gates.reports import junit_xml

    console = console_for(json_out)
    served = load(manifest, set_)
    report = verify_deployment(served, url, engine=engine, engine_version=engine_version, timeout_s=timeout)
    table = Table(title=f"gate verify: {served.name} {served.version} at {report.url}", title_justify="left")
    for column in ("field", "verdict", "reason", "from"):
        table.add_column(column, overflow="fold")
    for check in report.checks:
        table.add_row(
            check.name, f"[{STYLE[check.verdict]}]{check.verdict}[/]", check.reason, "; ".join(check.triggered_by)
        )
    print_table(console, table)
    counts = report.to_dict()["counts"]
    word = "DRIFT" if report.drift else "MATCH"
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    console.print(f"verdict: [{STYLE[report.verdict]}]{word}[/] ({summary}) in {report.duration_s:.1f} s")
    write_json(json_out, report.to_dict())
    if junit is not None:
        write_atomic(junit, junit_xml(report.as_gate_report(), command="gate verify", classname="servegate.verify"))
    if report.drift:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `gate export` and `gate verify` to the root app."""
    app.command("export")(export)
    app.command("verify")(verify)
