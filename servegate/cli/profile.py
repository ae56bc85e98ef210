"""`gate profile`: measure this machine's step times for a manifest and save the fitted latency model."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from servegate.cli.common import JsonOption, ManifestArg, SetOption, console_for, load, write_json
from servegate.contracts.manifest import ServedModel
from servegate.gates.reports import transient_progress

if TYPE_CHECKING:
    from servegate.capacity.latency.model import LatencyModel


def profile(
    manifest: ManifestArg,
    set_: SetOption = None,
    json_out: JsonOption = None,
    repeats: Annotated[int, typer.Option(min=1, max=50, help="Timed runs per step (the median is kept).")] = 5,
    burst: Annotated[int, typer.Option(min=2, max=64, help="Requests batched to measure per-sequence overhead.")] = 8,
) -> None:
    """Profile prefill and decode step times on this machine and fit the latency model `gate plan` uses.

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
        {
            "path": str(path),
            **{k: v for k, v in model.as_dict().items() if k != "fit"},
            "fit": {k: v for k, v in model.fit.items() if k != "step_samples"},
        },
    )


def profile_and_save(
    served: ServedModel, console: Console, repeats: int = 5, burst: int = 8
) -> tuple[LatencyModel, Path]:
    """Profile the manifest on this machine with a progress bar, save the latency model, print what was fitted."""
    from servegate.capacity.latency.model import profile_path
    from servegate.capacity.latency.profile import profile_manifest

    began = time.monotonic()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with transient_progress(console, *columns) as bar:
        task = bar.add_task("loading the model", total=None)

        def stage(name: str, total: int) -> None:
            bar.update(task, description=name, total=total or None, completed=0)

        model = profile_manifest(served, repeats=repeats, burst=burst, tick=lambda: bar.advance(task), stage=stage)
    path = model.save(profile_path(model.key, model.hardware))
    seconds = time.monotonic() - began
    c, fit = model.coefficients, model.fit
    hw = model.hardware
    n_in = served.preprocess.max_input_tokens
    console.print(f"[bold]{served.name}[/bold] profiled on {hw.get('cpu')} ({hw.get('cores')} cores)")
    console.print(
        f"prefill of {n_in} tokens: {1000 * model.prefill_time(n_in):.2f} ms; decode step at batch 1: "
        f"{1000 * model.decode_time(1, 64):.2f} ms, at batch 16: {1000 * model.decode_time(16, 64):.2f} ms"
    )
    console.print(
        f"bare model steps fitted over {fit['samples']} steps: median error {100 * fit['median_rel_error']:.1f}%, "
        f"p90 {100 * fit['p90_rel_error']:.1f}%"
    )
    if "serving_steps" in fit:
        console.print(
            f"serving steps under load fitted over {fit['serving_steps']} steps: median error "
            f"{100 * fit['serving_median_rel_error']:.1f}%, p90 {100 * fit['serving_p90_rel_error']:.1f}%; "
            f"step jitter {100 * model.step_jitter:.1f}%"
        )
    console.print(
        f"serving overheads: {1000 * model.request_overhead_s:.2f} ms before the first token, "
        f"{1000 * model.finish_overhead_s:.2f} ms after the last, {1000 * model.arrival_overhead_s:.3f} ms per "
        f"request admitted during a step, {1000 * model.completion_overhead_s:.3f} ms per request answered by the "
        f"step before, admission delayed {1000 * model.admission_delay_per_running_s:.3f} ms per running sequence; "
        f"steps {100 * model.load_slowdown_per_rps:.3f}% slower per request/s sent"
    )
    console.print("coefficients (seconds per unit): " + ", ".join(f"{k}={v:.3g}" for k, v in c.items()))
    for line in machine_speed_lines(fit):
        console.print(line, highlight=False)
    console.print(f"saved: {path} (profiled in {seconds:.0f} s)")
    return model, path


def machine_speed_lines(fit: dict[str, Any]) -> list[str]:
    """How fast this machine ran while the traced runs were served, and a warning when it did not hold still."""
    from servegate.capacity.bench.machine_speed import MachineSpeed

    if not fit.get("machine_speed"):
        return []
    speed = MachineSpeed.from_dict(fit["machine_speed"])
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
