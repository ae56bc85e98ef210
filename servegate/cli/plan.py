"""`gate plan`: a batching policy from workload, targets and memory budget; memory-only planning from a config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from servegate.cli.bench import WorkloadOption
from servegate.cli.common import JsonOption, SetOption, console_for, load, write_json
from servegate.cli.tables import print_table
from servegate.contracts.errors import ServegateError
from servegate.contracts.units import parse_bytes
from servegate.gates.reports import RichProgress, transient_progress

if TYPE_CHECKING:
    from servegate.capacity.latency.model import LatencyModel
    from servegate.capacity.memory.plan import MemoryPlan
    from servegate.capacity.planning.planner import Plan
    from servegate.contracts.capacity_section import Workload
    from servegate.contracts.manifest import ServedModel


def _memory_only(
    config_path: Path,
    budget: str | None,
    context: int | None,
    dtype: str,
    quantization: str,
    block_size: int,
    overhead: str | None,
    console: Console,
) -> dict[str, Any]:
    from servegate.capacity.memory.plan import plan_memory
    from servegate.capacity.memory.weights import read_config

    if budget is None or context is None:
        raise ServegateError("--model-config needs --memory-budget (e.g. 80GiB) and --context (tokens, e.g. 4096)")
    plan = plan_memory(
        read_config(config_path),
        context_tokens=context,
        memory_budget=parse_bytes(budget),
        dtype=dtype,
        quantization=quantization,
        block_size=block_size,
        runtime_overhead=parse_bytes(overhead) if overhead else None,
    )
    for line in plan.lines():
        console.print(line, highlight=False)
    if (short := plan.shortfall()) is not None:
        console.print(f"[red]infeasible[/red]: {short}", highlight=False)
    return {"mode": "memory-only", "model_config": str(config_path), **plan.as_dict(), "feasible": short is None}


def _verify(data: dict[str, Any], served: Any, workload: Any, model: Any, console: Console) -> dict[str, Any]:
    """Bench the recommended policy on the manifest's own server at the operating point, the claimed per-replica
    rate and just past it (planning/verify_points.py), each after a speed check (lone requests) that says
    whether the machine still runs as fast as when profiled; predicted (with its interval) against measured."""
    from servegate.capacity.bench.own_server import bench_own_server, manifest_tokenizer
    from servegate.capacity.latency.speed_check import (
        SpeedCheck,
        lone_workload,
        machine_comparison,
        machine_comparison_lines,
        predicted_lone_e2e_ms,
        profile_lone_bias,
    )
    from servegate.capacity.planning.verify_points import compare_point, point_rows, rate_text, verify_points

    rec = data["recommended"]
    runtime = served.runtime.model_dump(mode="python")
    runtime["max_model_len"] = rec["max_model_len"]
    if rec["kv_cache"] is not None:  # the pool the plan sized (an engine that allocates per slot needs it)
        runtime["kv_cache"] = rec["kv_cache"]
    policy = served.with_changes(batching=rec["batching"], runtime=runtime)
    if served.runtime.external:
        console.print(
            "verifying against the endpoint as it runs: start its engine with the recommended max_batch_size and "
            "max_num_batched_tokens first (`gate export`), else this measures the limits it was started with"
        )
    points = verify_points(workload, (data.get("per_replica") or {}).get("rate_rps"))
    console.print("verifying: " + "; ".join(f"{p.name} at {rate_text(p.workload)}" for p in points))
    lone = lone_workload(workload)
    with RichProgress(console) as progress:
        measured = bench_own_server(
            policy,
            [w for p in points for w in (lone, p.workload)],
            tokenizer=manifest_tokenizer(policy),
            model_name=policy.name,
            progress=progress,
        )
    predicted_lone = predicted_lone_e2e_ms(policy, model, lone)
    checks = [
        SpeedCheck(
            predicted_ms=predicted_lone,
            measured_ms=alone.as_dict()["e2el_ms"]["p50"],
            requests=lone.num_requests,
            profiled_at=model.provenance.profiled_at,
            bias=profile_lone_bias(model),
        )
        for alone in measured.results[0::2]
    ]
    reports = [r.as_dict() for r in measured.results[1::2]]
    machine = machine_comparison(model, reports[0])
    for line in [*checks[0].lines(), *machine_comparison_lines(machine)]:
        console.print(line, highlight=False)
    compared = [
        compare_point(p, policy, model, report, check.ratio)
        for p, report, check in zip(points, reports, checks, strict=True)
    ]
    table = Table(title="predicted vs measured (interval: 90% of runs under the profile's jitter)")
    for col in ("point", "metric", "predicted", "interval", "measured", "error", "verdict"):
        table.add_column(col, justify="left" if col in ("point", "metric", "verdict") else "right")
    for point in compared:
        for row in point_rows(point):
            table.add_row(*row)
    print_table(console, table)
    memory = _memory_line(data["memory"], measured.process_memory)
    if memory is not None:
        console.print(memory, highlight=False)
    return {
        "process_memory": measured.process_memory.as_dict() if measured.process_memory else None,
        "measured": reports[0],
        "comparison": compared[0]["comparison"],
        "speed_check": checks[0].as_dict(),
        "speed_checks": [c.as_dict() for c in checks],
        "points": compared,
        "machine_speed": machine,
    }


def _memory_line(planned: dict[str, Any], group: Any) -> str | None:
    """The plan's memory total against the process group read after the verify bench (None: not read)."""
    from servegate.contracts.units import format_bytes

    if group is None:
        return None
    got, total = group.total_bytes, planned["total_bytes"]
    said = f"memory: {group.describe()} after the bench"
    if not planned.get("modelled", True):
        return f"{said}; the plan did not model it"
    return f"{said}; the plan said {format_bytes(total)} ({100 * (total - got) / got:+.1f}%)"


def _total_rate(served: Any, total_rate: float | None, trace: Path | None, window: float) -> tuple[float, str] | None:
    """The rate all replicas carry together and where it came from: --arrival-trace's peak, --total-rate, or
    capacity.total_rate_rps."""
    from servegate.capacity.planning.replicas import load_arrival_trace, peak_rate

    if trace is not None:
        times = load_arrival_trace(trace)
        return peak_rate(times, window), f"the peak of {trace.name} over {window:g} s windows ({len(times)} arrivals)"
    if total_rate:
        return total_rate, "--total-rate"
    declared = served.capacity.total_rate_rps
    return (declared, "capacity.total_rate_rps") if declared else None


def candidate_table(rows: list[dict[str, Any]]) -> Table:
    """Every candidate policy tried, the recommended first, with why it won or lost."""
    from servegate.capacity.planning.report import policy_text

    table = Table(title=f"candidate policies ({len(rows)} tried)")
    heads = ("policy", "feasible", "worst/target", "TTFT p99", "E2E p50", "E2E p99", "capacity", "max rate", "verdict")
    for head in heads:
        table.add_column(head, justify="left" if head in ("policy", "verdict") else "right")

    def rate(x: float | None) -> str:
        return f"{x:.3g}/s" if x is not None else "-"

    for r in rows:
        table.add_row(
            policy_text(r["batching"]),
            "yes" if r["feasible"] else "no",
            f"{r['worst_target_ratio']:.2f}",
            f"{r['ttft_ms_p99']:.1f} ms",
            f"{r['e2el_ms_p50']:.1f} ms",
            f"{r['e2el_ms_p99']:.1f} ms",
            rate(r["capacity_requests_per_s"]),
            rate(r["max_rate_under_targets_rps"]),
            r["verdict"],
        )
    return table


def plan(
    manifest: Annotated[Path | None, typer.Argument(help="Manifest to plan for.", show_default=False)] = None,
    workload_file: WorkloadOption = None,
    write: Annotated[
        bool,
        typer.Option(
            "--write", help="Write the recommended batching, max_model_len and KV pool size into the manifest."
        ),
    ] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Bench the recommendation: predicted vs measured.")] = False,
    profile: Annotated[
        bool,
        typer.Option("--profile", help="Profile the manifest on this machine first (`gate profile`), then plan."),
    ] = False,
    model_config: Annotated[Path | None, typer.Option(help="config.json for memory-only planning.")] = None,
    memory_budget: Annotated[str | None, typer.Option(help="Total memory budget, e.g. 80GiB.")] = None,
    context: Annotated[int | None, typer.Option(help="Context length per sequence, tokens.")] = None,
    dtype: Annotated[str, typer.Option(help="Weights and KV dtype (memory-only).")] = "float16",
    quantization: Annotated[str, typer.Option(help="Weight quantization method (memory-only).")] = "none",
    block_size: Annotated[int, typer.Option(min=1, help="KV block size in tokens (memory-only).")] = 16,
    runtime_overhead: Annotated[str | None, typer.Option(help="Runtime memory overhead, e.g. 2GiB.")] = None,
    requests: Annotated[int, typer.Option(min=10, help="Requests simulated per candidate policy.")] = 300,
    total_rate: Annotated[
        float | None,
        typer.Option(min=0.0, help="Requests/s all replicas carry together (default: capacity.total_rate_rps)."),
    ] = None,
    arrival_trace: Annotated[
        Path | None,
        typer.Option(help="Arrival times (s), one a line or JSON lines with timestamp: replicas for its peak."),
    ] = None,
    peak_window: Annotated[float, typer.Option(min=0.001, help="Seconds over which a trace's peak is counted.")] = 60.0,
    set_: SetOption = None,
    json_out: JsonOption = None,
) -> None:
    """Plan capacity: recommend a batching policy that meets the manifest's targets, or say why none can.

    Uses the latency model `gate profile` fitted on this machine and simulates the manifest's own
    scheduler under its capacity.workload (or --workload).

    Examples:
      gate plan examples/quickstart/manifest.yaml --json plan.json
      gate plan examples/quickstart/manifest.yaml --write --verify
      gate plan examples/quickstart/manifest.yaml --profile    # no profile on this machine yet
      gate plan remote.yaml --total-rate 12                     # replicas for 12 requests/s in all
      gate plan remote.yaml --arrival-trace arrivals.txt        # replicas for the trace's busiest minute
      gate plan --model-config llama/config.json --memory-budget 80GiB --context 4096
    """
    from servegate.capacity.memory.plan import manifest_memory
    from servegate.capacity.planning.engine_memory import engine_memory

    console = console_for(json_out)
    if model_config is not None:
        data = _memory_only(
            model_config, memory_budget, context, dtype, quantization, block_size, runtime_overhead, console
        )
        write_json(json_out, data)
        if not data["feasible"]:  # an infeasible plan is a result, as a failed gate is: exit 1, not a usage error
            raise typer.Exit(1)
        return
    served, workload, model = _inputs(manifest, set_, workload_file, profile, console)
    memory = engine_memory(
        manifest_memory(served, context, runtime_overhead=model.runtime_overhead_bytes), served, model
    )
    total = _total_rate(served, total_rate, arrival_trace, peak_window)
    result = _search(served, workload, model, memory, requests, total, console)
    data = _report(result, served, workload, model, console)
    if write:
        _write_back(served, data, console)
    if verify:
        data["verify"] = _verify(data, served, workload, model, console)
    write_json(json_out, data)


def _inputs(
    manifest: Path | None, set_: list[str] | None, workload_file: Path | None, profile: bool, console: Console
) -> tuple[ServedModel, Workload, LatencyModel]:
    """The manifest to plan, its workload and its latency model (profiled first with `profile`, else the saved one)."""
    from servegate.capacity.bench.own_server import resolve_workload
    from servegate.capacity.latency.prediction import load_profile

    if manifest is None:
        raise ServegateError("give a MANIFEST, or --model-config CONFIG.json --memory-budget SIZE --context TOKENS")
    served = load(manifest, set_)
    if served.preprocess.task == "embed":
        raise ServegateError("gate plan models text generation; for an embedding manifest use --model-config")
    workload = resolve_workload(served, workload_file)
    if profile:
        from servegate.cli.profile import profile_and_save

        return served, workload, profile_and_save(served, console)[0]
    return served, workload, load_profile(served)


def _search(
    served: ServedModel,
    workload: Workload,
    model: LatencyModel,
    memory: MemoryPlan,
    requests: int,
    total: tuple[float, str] | None,
    console: Console,
) -> Plan:
    """Run the planner, with a progress bar over the candidate policies."""
    from servegate.capacity.planning.planner import plan as make_plan

    columns = (TextColumn("simulating policies"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with transient_progress(console, *columns) as bar:
        task = bar.add_task("plan", total=None)
        return make_plan(
            served,
            workload,
            model,
            memory,
            num_requests=requests,
            progress=lambda i, n: bar.update(task, completed=i, total=n),
            total=total,
        )


def _report(
    result: Plan, served: ServedModel, workload: Workload, model: LatencyModel, console: Console
) -> dict[str, Any]:
    """Print the memory plan, every candidate and the recommendation; return the plan's JSON."""
    from servegate.capacity.planning.report import plan_json, plan_lines

    for line in result.memory.lines():
        console.print(line, highlight=False)
    data = plan_json(result, model, workload.model_dump(mode="json"), served.fingerprint)
    print_table(console, candidate_table(data["candidates"]))
    for line in plan_lines(data):
        console.print(line, highlight=False)
    return data


def _write_back(served: ServedModel, data: dict[str, Any], console: Console) -> None:
    """--write: the recommended batching, and max_model_len and the KV pool where they changed, into the manifest."""
    from servegate.capacity.planning.report import write_plan

    if served.source is None:
        raise ServegateError("--write needs a manifest file")
    rec = data["recommended"]
    max_len = rec["max_model_len"] if rec["max_model_len"] != served.runtime.max_model_len else None
    declared_kv = served.runtime.kv_cache
    budget = (rec["kv_cache"] or {}).get("memory_budget")
    budget = budget if declared_kv is not None and budget != declared_kv.memory_budget else None
    write_plan(served.source, rec["batching"], max_len, budget)
    written = ["the batching section"] + (["runtime.max_model_len"] if max_len else [])
    written += ["runtime.kv_cache.memory_budget"] if budget else []
    console.print(f"wrote {', '.join(written)} into {served.source}")


def register(app: typer.Typer) -> None:
    """Add `gate plan` to the app."""
    app.command("plan")(plan)
