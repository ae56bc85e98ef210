"""Planner accuracy, taken apart: simulator, step costs, end to end (raw and at the machine's measured speed),
and the coverage of the prediction interval, for TTFT and end-to-end latency at three loads.

1. The latency model of the manifest on this machine (`gate profile`; loaded if saved, --reprofile to redo).
2. The knee: the requests/s the manifest's own batching policy sustains in simulation (closed loop, requests
   always waiting). Loads: 0.3x (low), 0.8x (near the knee) and 1.3x (overload) of it.
3. At each load `gate bench`'s load generator sends the same requests (same seed, arrivals and lengths)
   `--repeats` times to the manifest's own server, which runs with its step trace on; meanwhile a Python loop
   is timed on every CPU (machine_speed.py). Then, per load:
   - simulator error: every run's measured step durations replayed through the simulator with the run's own
     arrival times and each request's measured admission into the engine (latency/replay.py); predicted against
     measured p50/p99 (target: within 5%). The machine and the HTTP front are in what was measured, so what is
     left is the scheduling and queueing model (printed again below it: the same runs replayed with the model's
     request overhead and admission delay in place of the measured admissions, as before they were traced);
   - step-cost error: the fitted step model against the same measured steps, median and p90 of the relative
     error per kind of step (prefill, decode, mixed);
   - end-to-end error: the prediction (median of the interval's seeds) against the median of the runs,
     beside `machine` (the loop's median during the runs over its median while the profile's traced runs
     were served), and after rescaling the model by that ratio (`at speed`);
   - coverage: the share of runs whose measured p50/p99 fall inside the 90% prediction interval (simulated
     under 20 jitter seeds, from the profile's step jitter; latency/interval.py), and the interval's width.
Targets below the knee: E2E p50 within 10% and p99 within 15%, TTFT within 20%.

For `runtime.backend: vllm` or `endpoint` it runs benchmarks/planner_accuracy_engine.py instead: the
per-replica capacity against the measured knee and the coverage of its 90% interval over `--repeats` runs.

`--http-terms one` profiles afresh the variant of the latency model in which the CPU that HTTP work takes
from the engine is one term (the per-admission cost), not three (with the load slowdown and the admission
delay); `--http-terms three` profiles the full model afresh. Run the two interleaved to compare them.

    python benchmarks/planner_accuracy.py [--manifest examples/quickstart/manifest.yaml] [--set runtime.threads=1]
                                          [--requests 300] [--repeats 3] [--reprofile] [--http-terms {three,one}]
                                          [--json results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from servegate.capacity.bench.load_generator import run_once
from servegate.capacity.bench.local_server import LocalServer
from servegate.capacity.bench.machine_speed import MachineSpeedMonitor
from servegate.capacity.bench.own_server import manifest_tokenizer
from servegate.capacity.bench.targets import HttpTarget, PromptFactory
from servegate.capacity.bench.workload import make_requests, with_rate
from servegate.capacity.latency.interval import prediction_interval
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.prediction import profile_key, saturation_throughput, sim_setup
from servegate.capacity.latency.profile import HttpTerms, profile_manifest
from servegate.capacity.latency.provenance import hardware_id, profile_path
from servegate.capacity.latency.replay import (
    STEP_KINDS,
    admission_delays,
    at_speed,
    replay_durations,
    replay_run,
    run_window,
    specs_of_run,
    step_cost_errors,
    steps_in,
    way_out_delays,
)
from servegate.capacity.latency.serving_trace import serving_steps
from servegate.capacity.latency.simulate import simulate
from servegate.contracts.loading import load_manifest
from servegate.runtime.engine.step_trace import read_admissions, read_handoffs, read_step_trace

ROOT = Path(__file__).resolve().parents[1]
LOADS = (("low", 0.3), ("near knee", 0.8), ("overload", 1.3))
POINTS = (("ttft_ms", "p50"), ("ttft_ms", "p99"), ("e2el_ms", "p50"), ("e2el_ms", "p99"))
TARGETS = {("e2el_ms", "p50"): 0.10, ("e2el_ms", "p99"): 0.15, ("ttft_ms", "p50"): 0.20, ("ttft_ms", "p99"): 0.20}
SIMULATOR_TARGET = 0.05


def latency_model(served: Any, reprofile: bool, http_terms: HttpTerms | None) -> LatencyModel:
    """The saved profile, or a fresh one (saved for gate plan too); a fresh one of `http_terms` when given."""
    path = profile_path(profile_key(served), hardware_id())
    if path.is_file() and not reprofile and http_terms is None:
        print(f"latency model: {path}")
        return LatencyModel.load(path)
    print(f"profiling ({http_terms or 'three'} HTTP terms; model steps, then serving through the manifest's server)...")
    began = time.time()
    model = profile_manifest(served, http_terms=http_terms or "three")
    o = model.overheads
    print(f"profiled in {time.time() - began:.0f} s: arrival {1000 * o.arrival_s:.3f} ms, load slowdown "
          f"{100 * o.load_slowdown_per_rps:.3f}% per request/s, admission delay "
          f"{1000 * o.admission_delay_per_running_s:.3f} ms per running sequence")  # fmt: skip
    model.save(profile_path(model.provenance.key, model.provenance.hardware))
    return model


async def measure(url: str, served: Any, workload: Any, seed: int) -> Any:
    target = HttpTarget.for_manifest(url, served)
    try:
        await target.probe()
        return await run_once(target, workload, PromptFactory(manifest_tokenizer(served)), seed=seed)
    finally:
        await target.aclose()


def error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else float("nan")


def one_load(
    name: str, factor: float, knee: float, args: Any, served: Any, model: LatencyModel, server: Any, monitor: Any
) -> dict[str, Any]:
    """Predict, bench `args.repeats` times, replay each run's steps; the load's row."""
    setup = sim_setup(served)
    base = served.capacity.workload.model_copy(update={"num_requests": args.requests})
    workload = with_rate(base, round(factor * knee, 3))
    specs = make_requests(workload, args.seed)
    interval = prediction_interval(setup, model, specs)
    runs = [asyncio.run(measure(server.url, served, workload, args.seed)) for _ in range(args.repeats)]
    trace, admissions = read_step_trace(server.step_trace), read_admissions(server.step_trace)
    handoffs = read_handoffs(server.step_trace)
    row: dict[str, Any] = {"load": name, "rate_rps": workload.rate_rps, "interval": interval.as_dict()}
    machine = monitor.summary(runs[0].began_at, runs[-1].ended_at)
    profiled = model.fit.machine_speed
    speed = machine.relative_to(profiled) if machine and profiled else None
    row.update(machine_probe_us=machine.probe_us if machine else None, machine_over_profile=speed)
    at = at_speed(model, speed) if speed else None
    rescaled = [simulate(setup, at, specs, seed=s).summary() for s in range(5)] if at else []
    replays, steps = [], []
    for run in runs:
        window = steps_in(trace, *run_window(run.records))
        steps += serving_steps(window)
        delays = admission_delays(run.records, admissions)
        run_specs, durations = specs_of_run(specs, run.records), replay_durations(window)
        way_out = way_out_delays(run.records, handoffs)
        replayed = replay_run(setup, model, run_specs, durations, delays, way_out)
        model_way_out = replay_run(setup, model, run_specs, durations, delays)  # as before the way out was traced
        model_way_in = replay_run(setup, model, run_specs, durations)  # as before admissions were traced
        replays.append(
            {
                "summary": replayed.summary(),
                "summary_model_way_in": model_way_in.summary(),
                "summary_model_way_out": model_way_out.summary(),
                "steps_traced": len(window),
                "steps_replayed": replayed.steps,
                "admissions": sum(d is not None for d in delays),
                "ways_out": sum(f is not None and e is not None for f, e in way_out),
            }
        )
    row["steps_traced"] = [r["steps_traced"] for r in replays]
    row["steps_simulated"] = [r["steps_replayed"] for r in replays]
    row["admissions_replayed"] = [r["admissions"] for r in replays]
    row["ways_out_replayed"] = [r["ways_out"] for r in replays]
    row["step_cost"] = step_cost_errors(model, steps)
    for metric, p in POINTS:
        key = f"{metric}.{p}"
        measured = [r.summary[metric][p] for r in runs]
        got = statistics.median(measured)
        pred = interval.central[metric][p]
        replay_errors = [error(r["summary"][metric][p], m) for r, m in zip(replays, measured, strict=True)]
        way_in_errors = [error(r["summary_model_way_in"][metric][p], m) for r, m in zip(replays, measured, strict=True)]
        out_errors = [error(r["summary_model_way_out"][metric][p], m) for r, m in zip(replays, measured, strict=True)]
        row[key] = {
            "measured_each": measured,
            "measured": got,
            "predicted": pred,
            "error": error(pred, got),
            "at_speed": statistics.median(s[metric][p] for s in rescaled) if rescaled else None,
            "simulator_error_each": replay_errors,
            "simulator_error": statistics.median(replay_errors),
            "simulator_error_model_way_in": statistics.median(way_in_errors),
            "simulator_error_model_way_out": statistics.median(out_errors),
            "inside": [interval.contains(metric, p, m) for m in measured],
            "interval": [interval.low[metric][p], interval.high[metric][p]],
            "interval_width": interval.relative_width(metric, p),
        }
        row[key]["error_at_speed"] = error(row[key]["at_speed"], got) if rescaled else None
    return row


def pct(x: float | None) -> str:
    return f"{100 * x:+.1f}%" if x is not None else "-"


def report(rows: list[dict[str, Any]], args: Any, seconds: float) -> None:
    print(f"\nplanner accuracy, {args.requests} requests per load, {args.repeats} runs each ({seconds:.0f} s)")
    print("\n1. simulator error (measured steps, admissions, ways out replayed at the runs' arrivals; median of runs)")
    heads = "".join(f"{m[:-3] + ' ' + p:>12}" for m, p in POINTS)
    print(f"{'load':<11}{'req/s':>7}{heads}   steps traced/simulated; admissions; ways out measured")
    for r in rows:
        cells = "".join(f"{pct(r[f'{m}.{p}']['simulator_error']):>12}" for m, p in POINTS)
        pairs = ", ".join(f"{a}/{b}" for a, b in zip(r["steps_traced"], r["steps_simulated"], strict=True))
        admitted = ", ".join(str(n) for n in r["admissions_replayed"])
        ways = ", ".join(str(n) for n in r["ways_out_replayed"])
        print(f"{r['load']:<11}{r['rate_rps']:>7.2f}{cells}   {pairs}; {admitted}; {ways}")
    for r in rows:  # the same runs replayed with the model's finish overhead and no way out for the tokens
        cells = "".join(f"{pct(r[f'{m}.{p}']['simulator_error_model_way_out']):>12}" for m, p in POINTS)
        print(f"{r['load']:<11}{r['rate_rps']:>7.2f}{cells}   (measured admissions, the model's way out)")
    for r in rows:  # the same runs replayed with the model's request overhead and admission delay (and way out)
        cells = "".join(f"{pct(r[f'{m}.{p}']['simulator_error_model_way_in']):>12}" for m, p in POINTS)
        print(f"{r['load']:<11}{r['rate_rps']:>7.2f}{cells}   (the model's way in and out, nothing measured)")
    print("\n2. step-cost error (fitted step model against the measured steps: median / p90 of |relative error|)")
    print(f"{'load':<11}" + "".join(f"{k:>22}" for k in (*STEP_KINDS, "all")))
    for r in rows:
        cells = []
        for kind in (*STEP_KINDS, "all"):
            e = r["step_cost"].get(kind)
            text = f"{100 * e['median_rel_error']:.1f}% / {100 * e['p90_rel_error']:.1f}% (n={e['steps']})" if e else ""
            cells.append(f"{text:>22}")
        print(f"{r['load']:<11}" + "".join(cells))
    print("\n3. end-to-end error: predicted vs the median of the runs; machine = loop now / loop when profiled")
    print(f"{'load':<11}{'metric':<10}{'pred':>9}{'meas':>9}{'err':>9}{'machine':>9}{'at speed':>10}{'err':>9}")
    for r in rows:
        machine = f"{r['machine_over_profile']:.2f}x" if r["machine_over_profile"] else "-"
        for m, p in POINTS:
            c = r[f"{m}.{p}"]
            at = f"{c['at_speed']:.1f}" if c["at_speed"] is not None else "-"
            print(
                f"{r['load']:<11}{m[:-3] + ' ' + p:<10}{c['predicted']:>9.1f}{c['measured']:>9.1f}{pct(c['error']):>9}"
                f"{machine:>9}{at:>10}{pct(c['error_at_speed']):>9}"
            )
    print("\n4. coverage of the 90% prediction interval (runs inside / runs; mean relative width)")
    for m, p in POINTS:
        inside = [x for r in rows for x in r[f"{m}.{p}"]["inside"]]
        width = statistics.fmean(r[f"{m}.{p}"]["interval_width"] for r in rows)
        print(f"  {m[:-3]} {p}: {sum(inside)}/{len(inside)} inside, width {100 * width:.0f}% of the central value")
    below = [r for r in rows if r["load"] != "overload"]
    sim_ok = all(abs(r[f"{m}.{p}"]["simulator_error"]) <= SIMULATOR_TARGET for r in below for m, p in POINTS)
    e2e_ok = all(abs(r[f"{m}.{p}"]["error"]) <= t for r in below for (m, p), t in TARGETS.items())
    print(f"below the knee: simulator within 5%: {'yes' if sim_ok else 'NO'}; end to end within target: "
          f"{'yes' if e2e_ok else 'NO'}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", default=str(ROOT / "examples/quickstart/manifest.yaml"))
    parser.add_argument("--set", action="append", default=[], dest="sets", help="PATH=VALUE override (repeatable)")
    parser.add_argument("--requests", type=int, default=300, help="requests per load")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="bench runs per load")
    parser.add_argument("--reprofile", action="store_true")
    parser.add_argument("--http-terms", choices=("three", "one"), help="profile afresh with this variant")
    parser.add_argument("--json", help="write the rows as JSON to this path")
    args = parser.parse_args()

    served = load_manifest(Path(args.manifest), args.sets)
    if served.capacity.workload is None:
        raise SystemExit("the manifest declares no capacity.workload")
    if served.runtime.remote:  # an engine servegate does not run: no step trace; the knee and coverage instead
        from planner_accuracy_engine import report as engine_report
        from planner_accuracy_engine import run as engine_run

        result = engine_run(served, args.repeats, args.reprofile)
        result["figures"] = engine_report(result)
        if args.json:
            Path(args.json).write_text(json.dumps({"manifest": args.manifest, "sets": args.sets, **result}, indent=2))
        return
    began = time.time()
    model = latency_model(served, args.reprofile, args.http_terms)
    base = served.capacity.workload.model_copy(update={"num_requests": args.requests})
    knee = saturation_throughput(sim_setup(served), model, base, num_requests=max(200, args.requests))
    print(f"manifest {served.name} ({served.batching.mode}, max_batch_size {served.batching.max_batch_size}); "
          f"predicted knee {knee:.2f} requests/s; profile's machine loop "
          f"{model.fit.machine_speed.probe_us if model.fit.machine_speed else float('nan'):.0f} us")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "steps.jsonl"
        with LocalServer(served, step_trace=trace) as server, MachineSpeedMonitor() as monitor:
            for name, factor in LOADS:
                rows.append(one_load(name, factor, knee, args, served, model, server, monitor))
                print(f"  {name}: done ({time.strftime('%H:%M:%S', time.gmtime())} UTC)")
    report(rows, args, time.time() - began)
    if args.json:
        out = {
            "manifest": args.manifest,
            "sets": args.sets,
            "http_terms": args.http_terms,
            "knee_rps": knee,
            "hardware": dict(model.provenance.hardware),
            "overheads": model.overheads.as_dict(),
            "profiled_at": model.provenance.profiled_at,
            "load_average_1m": model.provenance.load_average_1m,
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
