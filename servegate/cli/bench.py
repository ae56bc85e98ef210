"""`gate bench`: measure latency and throughput of the manifest's own server or any OpenAI-compatible URL."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from servegate.cli.common import JsonOption, SetOption, console_for, load, write_json
from servegate.cli.tables import print_table
from servegate.contracts.capacity_section import Workload
from servegate.contracts.errors import ServegateError
from servegate.gates.reports import RichProgress

if TYPE_CHECKING:
    from servegate.capacity.bench.load_generator import BenchResult

WorkloadOption = Annotated[
    Path | None,
    typer.Option("--workload", help="Workload YAML (a capacity.workload section) replacing the manifest's."),
]


_METRICS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2EL"))


def _cell(v: dict[str, Any], p: str) -> str:
    """`12.30 [11.9-13.1]`: the percentile and its 95% interval, `n too small` where none can be formed."""
    if not v["count"]:
        return "-"
    ci = v.get(f"{p}_ci")
    if f"{p}_ci" not in v:
        return f"{v[p]:.2f}"
    return f"{v[p]:.2f} [{_short(ci[0])}-{_short(ci[1])}]" if ci is not None else f"{v[p]:.2f} [n too small]"


def _short(value: float) -> str:
    """About three significant figures without an exponent (1090, 36.4, 2.05)."""
    return f"{value:.0f}" if abs(value) >= 100 else (f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}")


def _table(title: str, data: dict[str, Any]) -> Table:
    table = Table(title=title, caption="\\[interval]: 95% interval by order statistics; conservative: LoadGen's "
                  "early-stopping p99 at 99% confidence (needs 662 samples)")  # fmt: skip
    for col in ("metric (ms)", "mean", "p50", "p95", "p99", "p99 conservative", "count"):
        table.add_column(col, justify="right" if col != "metric (ms)" else "left")
    for key, label in _METRICS:
        v = data[key]
        conservative = v.get("p99_conservative")
        table.add_row(
            label,
            f"{v['mean']:.2f}" if v["count"] else "-",
            *(_cell(v, p) for p in ("p50", "p95", "p99")),
            f"{conservative:.2f}" if conservative is not None else f"n < {v.get('p99_floor', 662)}",
            str(v["count"]),
        )
    return table


def supported_lines(report: dict[str, Any]) -> list[str]:
    """What the figures support, in words: each metric's p50 and p99 with their intervals and floors."""
    from servegate.capacity.bench.percentiles import describe

    unit = {"itl_ms": "gaps", "tpot_ms": "requests"}
    return [
        f"  {describe(label, report[key], q, unit.get(key, 'requests'))}"
        for key, label in _METRICS
        if report.get(key)
        for q in (50, 99)
    ]


def print_result(console: Console, report: dict[str, Any]) -> None:
    """Definitions, the latency table, throughput and goodput, per-run lines and the interval across runs."""
    console.print("[bold]definitions[/bold]")
    for name, text in report["definitions"].items():
        console.print(f"  {name}: {text}")
    runs = report["runs"]
    sweep = len({r["rate_rps"] for r in runs}) > 1
    if sweep:
        for r in runs:
            print_table(console, _table(f"offered {r['rate_rps']:g} requests/s", r))
            console.print(_rates(r))
    elif not report["requests"]["completed"]:
        console.print(f"no request completed ({report['requests']['failed']} failed): no latency to report")
    else:
        print_table(console, _table(f"{len(runs)} run(s), {report['requests']['completed']} completed", report))
        console.print(_rates(report))
        console.print("what these figures support:")
        for line in supported_lines(report):
            console.print(line, highlight=False)
    for line in machine_lines(report):
        console.print(line, highlight=False)
    if "across_runs" in report:
        a = report["across_runs"]
        for key, label in _METRICS:
            for p in ("p50", "p99"):
                v = a[key][p]
                console.print(
                    f"  {label} {p} across {v['runs']} runs: {v['mean']:.2f} ms "
                    f"({100 * a['confidence']:.0f}% interval across runs {v['low']:.2f} to {v['high']:.2f} ms)",
                    highlight=False,
                )
    d = report.get("dispatch_delay_ms")
    if d and d.get("count"):
        console.print(
            f"dispatch delay (actual - scheduled send): p50 {d['p50']:.3f} ms, p99 {d['p99']:.3f} ms, "
            f"max {d['max']:.3f} ms",
            highlight=False,
        )
    for warning in report.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)


def machine_lines(report: dict[str, Any]) -> list[str]:
    """How fast this machine ran during the bench (and in each run, when there were several)."""
    from servegate.capacity.bench.machine_speed import MachineSpeed

    if not report.get("machine_speed"):
        return []
    speed = MachineSpeed.from_dict(report["machine_speed"])
    lines = [f"this machine during the bench: {speed.describe()}"]
    per_run = [r["machine_speed"]["probe_us"] for r in report.get("runs", []) if r.get("machine_speed")]
    if len(per_run) > 1:
        lines.append("  loop median per run: " + ", ".join(f"{us:.0f}" for us in per_run) + " us")
    if not speed.steady:
        lines.append(
            "  the machine's speed moved while it was measured (other work on its cores): these figures describe "
            "this stretch of time, not the server; repeat on a steady machine"
        )
    return lines


def _rates(data: dict[str, Any]) -> str:
    t, g, r = data["throughput"], data["goodput"], data["requests"]
    slo = ", ".join(f"{k} <= {v:g}" for k, v in g["slo"].items() if v is not None) or "no SLO declared"
    return (
        f"throughput: {t['requests_per_s']:.2f} requests/s, {t['output_tokens_per_s']:.1f} output tokens/s; "
        f"goodput: {g['requests_per_s']:.2f} requests/s ({100 * g['fraction']:.1f}% within {slo}); "
        f"failed: {r['failed']} of {r['sent']}"
    )


def bench(
    manifest: Annotated[Path | None, typer.Argument(help="Manifest whose own server is benchmarked.")] = None,
    url: Annotated[str | None, typer.Option(help="Any OpenAI-compatible server, e.g. http://HOST:PORT/v1.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name sent to --url (default: the manifest's).")] = None,
    workload_file: WorkloadOption = None,
    rate: Annotated[float | None, typer.Option(help="Open-loop rate, requests/s.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Closed loop: requests kept in flight.")] = None,
    sweep: Annotated[str | None, typer.Option(help="Comma-separated rates (requests/s), one run each.")] = None,
    requests: Annotated[int | None, typer.Option(help="Requests per run.")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Runs at the same load (an interval is reported).")] = 1,
    suite: Annotated[str | None, typer.Option(help="Take prompt lengths from this eval suite (e.g. arith).")] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer directory for exact prompt lengths with --url.")
    ] = None,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="Goodput SLO on TTFT, ms.")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="Goodput SLO on TPOT, ms.")] = None,
    slo_e2el_ms: Annotated[float | None, typer.Option(help="Goodput SLO on end-to-end latency, ms.")] = None,
    plots: Annotated[Path | None, typer.Option(help="Directory for PNG plots (latency CDF, rate curves).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of arrivals, lengths and prompts.")] = 0,
    set_: SetOption = None,
    json_out: JsonOption = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", help="NAME:VALUE sent with every request (repeatable).")
    ] = None,
    max_error_share: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="Share of requests allowed to fail; beyond it the bench exits 1 (default 0: none)."
        ),
    ] = 0.0,
    records_out: Annotated[
        Path | None, typer.Option("--records", help="Write one JSON line per request (its latencies, tokens, error).")
    ] = None,
    prompts_file: Annotated[
        Path | None,
        typer.Option(
            "--prompts",
            help='JSONL of {"prompt": ..., "max_tokens": N} lines, sent exactly and in order (one request a line; '
            "guidellm's output_tokens_count is read too).",
        ),
    ] = None,
    arrival: Annotated[
        str | None, typer.Option(help="Open-loop arrivals with --rate: poisson (default), gamma or constant.")
    ] = None,
) -> None:
    """Load-test a server: TTFT, TPOT, ITL and end-to-end latency percentiles, throughput and goodput.

    Without --url the manifest's own server is started locally. Open-loop arrivals (Poisson or gamma)
    are measured from their scheduled send time, so queueing is never hidden (no coordinated omission).

    Every percentile comes with its 95% interval (order statistics) and LoadGen's conservative estimate.
    The bench checks itself: it exits 1 when more than --max-error-share of the requests fail, and warns
    when responses' usage shows the workload's shape was not run (truncated prompts, outputs stopped
    before max_tokens) or when the client itself fell behind its schedule (client_limited in the JSON).

    Examples:
      gate bench examples/quickstart/manifest.yaml --repeats 3 --plots bench-plots
      gate bench --url http://10.0.0.5:8000/v1 --model llama --rate 4 --requests 200
      gate bench examples/quickstart/manifest.yaml --sweep 1,2,4,8 --json bench.json
      gate bench --url http://127.0.0.1:8000/v1 --model tiny --prompts prompts.jsonl --rate 5 --arrival constant
    """
    from servegate.capacity.bench.own_server import (
        bench_own_server,
        bench_url,
        load_tokenizer,
        manifest_tokenizer,
        resolve_workload,
    )
    from servegate.capacity.bench.prompt_file import load_prompt_file
    from servegate.capacity.bench.run_metrics import SLO, slo_from_targets
    from servegate.capacity.bench.workload import suite_prompt_lengths

    served = load(manifest, set_) if manifest is not None else None
    if served is not None and served.preprocess.task == "embed":
        raise ServegateError("gate bench measures text generation; this manifest serves embeddings (task: embed)")
    if served is None and url is None:
        raise ServegateError("give a MANIFEST (its own server is started) or --url of a running server")
    tok = load_tokenizer(tokenizer) if tokenizer else (manifest_tokenizer(served) if served else None)
    prompt_file = load_prompt_file(prompts_file, tok) if prompts_file is not None else None
    if prompt_file is not None and requests is None:
        requests = len(prompt_file)
    workload = with_arrival(resolve_workload(served, workload_file, rate, concurrency, requests), arrival)
    rates = [float(x) for x in sweep.split(",") if x.strip()] if sweep else None
    base = slo_from_targets(served.capacity.targets if served else None)
    slo = SLO(slo_ttft_ms or base.ttft_ms, slo_tpot_ms or base.tpot_ms, slo_e2el_ms or base.e2el_ms)
    lengths = suite_prompt_lengths(suite) if suite else None
    console = console_for(json_out)
    name = model or (served.runtime.endpoint_model or served.name if served else None)
    options: dict[str, Any] = dict(
        model_name=name, tokenizer=tok, repeats=repeats, rates=rates, slo=slo, prompt_lengths=lengths, seed=seed
    )
    options["headers"] = parse_headers(header)
    options["prompt_file"] = prompt_file
    with RichProgress(console) as progress:
        if url is not None:
            result, peak = bench_url(url, workload, served=served, progress=progress, **options), None
        else:
            assert served is not None
            if not served.runtime.external:
                console.print(f"starting {served.name}'s server...")
            measured = bench_own_server(served, [workload], progress=progress, **options)
            result, peak = measured.results[0], measured.peak_memory_bytes
    result.max_error_share = max_error_share
    _report(
        console,
        result,
        peak,
        approximate=url is not None and tok is None,
        plots=plots,
        json_out=json_out,
        records_out=records_out,
    )


def _report(
    console: Console,
    result: BenchResult,
    peak: int | None,
    *,
    approximate: bool,
    plots: Path | None,
    json_out: str | None,
    records_out: Path | None,
) -> None:
    """Print the bench's result and write what was asked for (plots, JSON, per-request records); exit 1 when
    more requests failed than allowed."""
    report = result.as_dict()
    if approximate:
        report["warnings"].insert(0, APPROXIMATE_PROMPTS)
    if peak is not None:
        report["peak_memory_bytes"] = peak
        report["peak_memory_note"] = "peak resident memory of the local server process (weights, KV pool, runtime)"
    print_result(console, report)
    if "peak_memory_bytes" in report:
        from servegate.contracts.units import format_bytes

        console.print(f"server peak memory: {format_bytes(report['peak_memory_bytes'])} (resident, whole process)")
    if plots is not None:
        from servegate.capacity.bench.plots import write_plots

        report["plots"] = [str(p) for p in write_plots(result, plots)]
        console.print("plots: " + ", ".join(report["plots"]))
    write_json(json_out, report)
    if records_out is not None:
        from servegate.capacity.bench.load_generator import records_jsonl

        records_out.parent.mkdir(parents=True, exist_ok=True)
        records_out.write_text(records_jsonl(result), encoding="utf-8")
        console.print(f"per-request records: {records_out}")
    if report["errors"]["exceeded"]:
        from servegate.capacity.bench.checks import failure_sentence

        console.print(f"[red]bench failed:[/red] {failure_sentence(report['errors'])}", highlight=False)
        raise typer.Exit(1)


APPROXIMATE_PROMPTS = (
    "prompt lengths are approximate: without --tokenizer about 4 characters are sent per requested token "
    "(workload_shape.prompt_tokens in the JSON has what the server counted)"
)


def with_arrival(workload: Workload, arrival: str | None) -> Workload:
    """The workload with `--arrival` as its open-loop arrival process (unchanged without one)."""
    if arrival is None:
        return workload
    if arrival not in ("poisson", "gamma", "constant"):
        raise ServegateError(f"--arrival {arrival}: choose poisson, gamma or constant")
    if workload.arrival == "closed":
        raise ServegateError("--arrival is for open loops: give --rate R with it, not --concurrency")
    return Workload.model_validate({**workload.model_dump(), "arrival": arrival})


def parse_headers(values: list[str] | None) -> dict[str, str]:
    """`--header NAME:VALUE` options as a dict; a value without a colon is a usage error."""
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, text = value.partition(":")
        if not sep or not name.strip():
            raise ServegateError(f"--header {value!r}: write it as NAME:VALUE, e.g. --header 'X-Tenant: acme'")
        out[name.strip()] = text.strip()
    return out


def register(app: typer.Typer) -> None:
    """Add `gate bench` to the app."""
    app.command("bench")(bench)
