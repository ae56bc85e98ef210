"""`gate profile`: measure this machine's step times for a manifest and save the fitted latency model."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from servegate.cli.common import JsonOption, ManifestArg, SetOption, console_for, load, write_json
from servegate.contracts.manifest import ServedModel
from servegate.contracts.units import format_bytes
from servegate.gates.reports import transient_progress

if TYPE_CHECKING:
    from servegate.capacity.bench.machine_speed import MachineSpeed
    from servegate.capacity.latency.model import LatencyModel


def profile(
    manifest: ManifestArg,
    set_: SetOption = None,
    json_out: JsonOption = None,
    repeats: Annotated[int, typer.Option(min=1, max=50, help="Timed runs per step (the median is kept).")] = 5,
    burst: Annotated[int, typer.Option(min=2, max=64, help="Requests batched to measure per-sequence overhead.")] = 8,
) -> None:
    """Profile prefill and decode step times on this machine and fit the latency model `gate plan` uses.

    For `runtime.backend: endpoint` (or vllm) the engine is profiled from outside: TTFT against prompt length,
    ITL against concurrency and context, and a short rate sweep for the knee (see docs/capacity-endpoint.md).

    Model steps are timed in this process (prefill against prompt tokens, decode against batch size and
    context length); serving overheads are measured through the manifest's own server. The model is saved
    as JSON keyed by the manifest's fingerprint (batching excluded) and the hardware, under
    $SERVEGATE_HOME/profiles (default ~/.cache/servegate/profiles).

    Example: gate profile examples/quickstart/manifest.yaml
    """
    served = load(manifest, set_)
    model, path = profile_and_save(served, console_for(json_out), repeats=repeats, burst=burst)
    write_json(
        json_out,
        {"path": str(path), **model.as_dict(samples=False)},
    )


def profile_and_save(
    served: ServedModel, console: Console, repeats: int = 5, burst: int = 8
) -> tuple[LatencyModel, Path]:
    """Profile the manifest on this machine with a progress bar, save the latency model, print what was fitted."""
    from servegate.capacity.latency.profile import profile_manifest
    from servegate.capacity.latency.provenance import profile_path

    began = time.monotonic()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with transient_progress(console, *columns) as bar:
        task = bar.add_task("loading the model", total=None)

        def stage(name: str, total: int) -> None:
            bar.update(task, description=name, total=total or None, completed=0)

        if served.runtime.remote:
            from servegate.capacity.latency.blackbox import profile_endpoint

            model = profile_endpoint(served, repeats=repeats, stage=lambda name: stage(name, 0))
        else:
            model = profile_manifest(served, repeats=repeats, burst=burst, tick=lambda: bar.advance(task), stage=stage)
    path = model.save(profile_path(model.provenance.key, model.provenance.hardware))
    if model.fit.black_box is not None:
        for line in blackbox_lines(served, model):
            console.print(line, highlight=False)
        console.print(f"saved: {path} (profiled in {time.monotonic() - began:.0f} s)")
        return model, path
    seconds = time.monotonic() - began
    fit, hw, o = model.fit, model.provenance.hardware, model.overheads
    n_in = served.preprocess.max_input_tokens
    console.print(f"[bold]{served.name}[/bold] profiled on {hw.get('cpu')} ({hw.get('cores')} cores)")
    console.print(
        f"prefill of {n_in} tokens: {1000 * model.prefill_time(n_in):.2f} ms; decode step at batch 1: "
        f"{1000 * model.decode_time(1, 64):.2f} ms, at batch 16: {1000 * model.decode_time(16, 64):.2f} ms"
    )
    if (bare := fit.model_steps) is not None:
        console.print(
            f"bare model steps fitted over {bare.steps} steps: median error {100 * bare.median_rel_error:.1f}%, "
            f"p90 {100 * bare.p90_rel_error:.1f}%"
        )
    if (serving := fit.serving_steps) is not None:
        console.print(
            f"serving steps under load fitted over {serving.steps} steps: median error "
            f"{100 * serving.median_rel_error:.1f}%, p90 {100 * serving.p90_rel_error:.1f}%; "
            f"step jitter {100 * model.jitter.spread:.1f}%"
        )
    console.print(
        f"serving overheads: {1000 * o.request_s:.2f} ms before the first token, "
        f"{1000 * o.finish_s:.2f} ms after the last, {1000 * o.arrival_s:.3f} ms per "
        f"request admitted during a step, {1000 * o.completion_s:.3f} ms per request answered by the "
        f"step before, admission delayed {1000 * o.admission_delay_per_running_s:.3f} ms per running sequence; "
        f"steps {100 * o.load_slowdown_per_rps:.3f}% slower per request/s sent; "
        f"under load {1000 * o.serving_work_s:.2f} ms more of the machine per request"
        + (f" (served at most {o.capacity_rps:.3g} requests/s)" if o.capacity_rps else "")
    )
    steps = model.steps.as_dict()
    console.print("coefficients (seconds per unit): " + ", ".join(f"{k}={v:.3g}" for k, v in steps.items()))
    for line in machine_speed_lines(fit.machine_speed):
        console.print(line, highlight=False)
    console.print(f"saved: {path} (profiled in {seconds:.0f} s)")
    return model, path


def blackbox_lines(served: ServedModel, model: LatencyModel) -> list[str]:
    """What a black-box profile of an engine found: its step costs, the fit's error, the knee."""
    c, o, box = model.steps, model.overheads, model.fit.black_box
    assert box is not None
    lines = [
        f"[bold]{served.name}[/bold] profiled from outside ({served.runtime.backend} {box.endpoint}), the engine "
        "modelled as continuous batching",
        f"prefill: {1e6 * c.c_prefill_token:.1f} us per prompt token; decode step: {1000 * c.c_step:.2f} ms "
        f"+ {1000 * c.c_decode_seq:.3f} ms per sequence; {1000 * o.request_s:.2f} ms before the first "
        f"token, {1000 * o.finish_s:.2f} ms after the last; step jitter {100 * model.jitter.spread:.0f}%",
        f"fit: TTFT median error {100 * box.ttft_median_rel_error:.1f}% over {len(box.ttft_points)} prompt "
        f"lengths, ITL {100 * box.itl_median_rel_error:.1f}% over {len(box.itl_points)} bursts",
    ]
    if box.knee is not None:
        lines += box.knee.lines()
    if box.stream is not None:
        lines += box.stream.lines()
    if (group := box.process_memory) is not None:
        lines.append(f"memory: {group.describe()} after the sweeps (KV pool {format_bytes(group.kv_pool_bytes)})")
    return lines


def machine_speed_lines(speed: MachineSpeed | None) -> list[str]:
    """How fast this machine ran while the traced runs were served, and a warning when it did not hold still."""
    if speed is None:
        return []
    lines = [f"this machine while serving the traced runs: {speed.describe()}"]
    if not speed.steady:
        lines.append(
            "  warning: its speed moved while it was profiled (other work on its cores): predictions from this "
            "profile hold only while the machine runs as it did; profile again when it is steady, and read "
            "`gate plan --verify`'s machine line beside its errors"
        )
    return lines


def register(app: typer.Typer) -> None:
    """Add `gate profile` to the app."""
    app.command("profile")(profile)
