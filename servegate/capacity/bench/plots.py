"""PNG plots of a bench: latency CDFs, and throughput and p99 latency against the offered rate."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servegate.capacity.bench.load_generator import BenchResult
from servegate.contracts.files import write_atomic

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _pyplot() -> Any:  # matplotlib.pyplot, imported on first use
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return write_atomic(path, buffer.getvalue())


def latency_cdf(result: BenchResult, path: Path) -> Path:
    """CDF of TTFT and end-to-end latency (ms), one curve per run."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for run in result.runs:
        done = [r for r in run.records if r.ok]
        label = f"{run.rate_rps:g} req/s" if run.rate_rps else f"concurrency {run.concurrency}"
        pairs = ((axes[0], [r.ttft for r in done], "ttft_ms"), (axes[1], [r.e2el for r in done], "e2el_ms"))
        for ax, values, key in pairs:
            xs = np.sort(1000 * np.asarray(values))
            (line,) = ax.plot(xs, np.arange(1, len(xs) + 1) / max(len(xs), 1), label=label)
            _interval_bars(ax, run.summary.get(key) or {}, line.get_color())
    for ax, title in zip(axes, ("TTFT", "end-to-end latency"), strict=True):
        ax.set_xlabel(f"{title} (ms); bars: 95% intervals of p50/p95/p99")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{title} CDF")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    path = _save(fig, path)
    plt.close(fig)
    return path


def _interval_bars(ax: Axes, stats: dict[str, Any], color: str) -> None:
    """Horizontal bars at p50, p95 and p99 spanning each percentile's 95% interval, where it could be formed."""
    for q in (50, 95, 99):
        ci = stats.get(f"p{q}_ci")
        if ci is not None:
            value = stats[f"p{q}"]
            err = [[max(value - ci[0], 0.0)], [max(ci[1] - value, 0.0)]]
            ax.errorbar([value], [q / 100], xerr=err, fmt="|", color=color, capsize=3, lw=1)


def rate_curves(result: BenchResult, path: Path) -> Path:
    """Throughput (requests/s) and p99 end-to-end latency (ms) against the offered rate."""
    plt = _pyplot()
    runs = [r for r in result.runs if r.rate_rps is not None]
    rates = [r.rate_rps for r in runs]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(rates, [r.summary["throughput"]["requests_per_s"] for r in runs], "o-", label="throughput")
    ax.plot(rates, rates, ":", color="grey", label="offered")
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("throughput (requests/s)")
    ax.grid(alpha=0.3)
    right = ax.twinx()
    p99 = [r.summary["e2el_ms"]["p99"] for r in runs]
    cis = [r.summary["e2el_ms"].get("p99_ci") for r in runs]
    err = [[p - c[0] if c else 0.0 for p, c in zip(p99, cis, strict=True)],
           [c[1] - p if c else 0.0 for p, c in zip(p99, cis, strict=True)]]  # fmt: skip
    right.errorbar(rates, p99, yerr=err, fmt="s--", color="tab:red", capsize=3, label="p99 E2EL (95% interval)")
    right.set_ylabel("p99 end-to-end latency (ms)")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    ax.set_title("throughput and p99 latency vs rate")
    path = _save(fig, path)
    plt.close(fig)
    return path


def write_plots(result: BenchResult, directory: Path) -> list[Path]:
    """Both plots into `directory` (the rate plot only when some run had an offered rate)."""
    out = [latency_cdf(result, directory / "latency_cdf.png")]
    if any(r.rate_rps is not None for r in result.runs):
        out.append(rate_curves(result, directory / "rate_curves.png"))
    return out
