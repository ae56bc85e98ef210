"""The note's plots: the latency CDF and throughput against load, from the bench.

The bench may have written the PNGs itself (listed under `plots` in its JSON); they are copied next
to the note. Otherwise they are drawn here with matplotlib's Agg canvas (no display, no pyplot state)
from the bench JSON (read as servegate.contracts.report.capacity_evidence.BenchEvidence): the CDF through the
reported percentiles; throughput and p99 latency against the offered load of each run.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servegate.contracts.files import write_atomic
from servegate.contracts.report.capacity_evidence import BenchEvidence, BenchRunFigures, LatencyFigures, Throughput

PlotFile = tuple[dict[str, str], bytes]
"""({title, path relative to the note}, PNG bytes)."""

LATENCY_CDF = ("latency-cdf", "Latency CDF")
THROUGHPUT_VS_LOAD = ("throughput-vs-load", "Throughput and p99 latency against load")
_KINDS = {LATENCY_CDF: ("cdf",), THROUGHPUT_VS_LOAD: ("throughput", "load", "rate", "sweep")}
_LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2E latency"))


def _finite(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _png(draw: Callable[[Any], None]) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    draw(fig)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def draw_latency_cdf(bench: BenchEvidence) -> bytes:
    """Latency CDF through the reported percentiles: fraction of requests at or below each, for TTFT, TPOT and E2E."""

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        from_percentiles = False
        for key, label in _LATENCIES:
            stats: LatencyFigures = getattr(bench, key) or LatencyFigures()
            points = [
                (v, q) for p, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)) if (v := _finite(stats.percentile(p)))
            ]
            if points:
                from_percentiles = True
                ax.plot([v for v, _ in points], [q for _, q in points], marker="o", label=f"{label} (p50/p95/p99)")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.set_title("Latency CDF" + (" (through the reported percentiles)" if from_percentiles else ""))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right")

    return _png(draw)


def _load_points(bench: BenchEvidence) -> tuple[str, list[tuple[float, float | None, float | None]]]:
    """(x label, [(offered load, requests/s achieved, p99 E2E ms)]) from the bench's runs (the bench itself
    when it lists none)."""
    runs: list[BenchRunFigures] = bench.runs or [BenchRunFigures(throughput=bench.throughput, e2el_ms=bench.e2el_ms)]
    closed = all(_finite(r.rate_rps) is None for r in runs)
    workload = bench.workload
    declared = (workload.concurrency if closed else workload.rate_rps) if workload is not None else None
    points = []
    for run in runs:
        load = _finite(run.concurrency if closed else run.rate_rps)
        load = load if load is not None else _finite(declared)
        throughput, e2e = run.throughput or Throughput(), run.e2el_ms or LatencyFigures()
        if load is not None:
            points.append((load, _finite(throughput.requests_per_s), _finite(e2e.p99)))
    return ("concurrency (requests in flight)" if closed else "offered load (requests/s)"), sorted(points)


def draw_throughput_vs_load(bench: BenchEvidence) -> bytes:
    """Achieved throughput (requests/s) and p99 E2E latency (ms) against the offered load of each run."""
    xlabel, points = _load_points(bench)

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        xs = [p[0] for p in points]
        ax.plot(xs, [p[1] for p in points], marker="o", color="tab:blue", label="throughput")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("throughput (requests/s)", color="tab:blue")
        ax.grid(True, alpha=0.3)
        right = ax.twinx()
        right.plot(xs, [p[2] for p in points], marker="s", color="tab:red", label="p99 E2E")
        right.set_ylabel("p99 E2E latency (ms)", color="tab:red")
        ax.set_xlim(left=0, right=max(xs, default=1) * 1.15 or 1)
        ax.set_ylim(bottom=0)
        right.set_ylim(bottom=0)
        handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="upper left")
        ax.set_title("Throughput and p99 latency against load")

    return _png(draw)


def _bench_pngs(bench: BenchEvidence, base_dir: Path | None) -> dict[tuple[str, str], Path]:
    """The bench's own PNGs by kind, from its `plots` (the paths it wrote)."""
    found: dict[tuple[str, str], Path] = {}
    for value in bench.plots:
        name = value
        if not value.lower().endswith(".png"):
            continue
        # `gate bench --plots DIR` records paths as given on its command line: try them as they are, then
        # relative to the bench JSON's folder.
        tries = [Path(value)] + ([base_dir / value] if base_dir is not None and not Path(value).is_absolute() else [])
        path = next((p for p in tries if p.is_file()), None)
        if path is None:
            continue
        for kind, words in _KINDS.items():
            if kind not in found and any(w in f"{name} {path.name}".lower() for w in words):
                found[kind] = path
                break
    return found


def prepare_plots(bench: BenchEvidence, base_dir: Path | None, note_path: Path) -> list[PlotFile]:
    """Both plots for the note at `note_path`: the bench's PNGs when it wrote them, else drawn here."""
    own = _bench_pngs(bench, base_dir)
    out: list[PlotFile] = []
    for kind, draw in ((LATENCY_CDF, draw_latency_cdf), (THROUGHPUT_VS_LOAD, draw_throughput_vs_load)):
        slug, title = kind
        data = own[kind].read_bytes() if kind in own else draw(bench)
        out.append(({"title": title, "path": f"{note_path.stem}.{slug}.png"}, data))
    return out


def write_plots(plots: list[PlotFile], note_path: Path) -> None:
    """Write prepared plots next to the note (each atomically)."""
    for meta, data in plots:
        write_atomic(note_path.parent / meta["path"], data)
