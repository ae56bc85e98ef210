"""`gate eval`: a manifest's eval suites, scored, with confidence intervals."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from servegate.cli.common import JsonOption, ManifestArg, SetOption, console_for, load, write_json
from servegate.cli.tables import print_table
from servegate.contracts.errors import ServegateError


def evaluate(
    manifest: ManifestArg,
    suite: Annotated[list[str] | None, typer.Option("--suite", help="Evaluate only this suite (repeatable).")] = None,
    set_: SetOption = None,
    json_out: JsonOption = None,
) -> None:
    """Run the manifest's eval suites on its engine as declared and print each metric with its interval.

    Intervals are two-sided at quality.confidence: Clopper-Pearson for pass/fail metrics, a bootstrap
    otherwise. Example: gate eval examples/quickstart/manifest.yaml --suite recall --json -
    """
    import difflib

    from servegate.gates.base import CheckResources, EnginePool, GateContext, quiet_libraries
    from servegate.gates.quality.statistics import score_interval
    from servegate.gates.reports import RichProgress

    quiet_libraries()
    served = load(manifest, set_)
    declared = [s.name for s in served.quality.suites]
    if not declared:
        raise ServegateError(f"{manifest}: quality.suites is empty: declare at least one suite to evaluate")
    for name in suite or []:
        if name not in declared:
            close = difflib.get_close_matches(name, declared, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ServegateError(f"unknown suite {name!r}; {hint}declared: {', '.join(declared)}")
    console = console_for(json_out)
    pool = EnginePool()
    ctx = GateContext(served, served, resources=CheckResources(engines=pool))
    payload: dict[str, Any] = {"name": served.name, "fingerprint": served.fingerprint, "suites": {}}
    table = Table(title=f"gate eval: {served.name} {served.version}", title_justify="left")
    for column in ("suite", "metric", "n", "score", f"{served.quality.confidence:.0%} interval", "errors"):
        table.add_column(column)
    try:
        with RichProgress(console) as progress:
            ctx.progress = progress
            for data in ctx.suites():
                if suite and data.name not in suite:
                    continue
                run = ctx.run_suite(served, data, role="candidate")
                errors = sum(o.error is not None for o in run.outputs)
                metrics = {}
                for metric, scores in run.scores.items():
                    interval = score_interval(scores, served.quality.confidence)
                    metrics[metric] = interval.to_dict()
                    table.add_row(
                        data.name, metric, str(interval.n), f"{interval.score:.4f}",
                        f"[{interval.low:.4f}, {interval.high:.4f}]", str(errors),
                    )  # fmt: skip
                payload["suites"][data.name] = {"items": len(run.outputs), "errors": errors, "metrics": metrics}
                if data.suite.lm_eval is not None:  # lm-eval's own figure, comparable with numbers published elsewhere
                    from servegate.gates.lm_eval.tasks import lm_eval_aggregate

                    payload["suites"][data.name]["lm_eval_aggregate"] = lm_eval_aggregate(served, data, run.scores)
    finally:
        pool.close()
    print_table(console, table)
    write_json(json_out, payload)


def register(app: typer.Typer) -> None:
    """Add `gate eval` to the root app."""
    app.command("eval")(evaluate)
