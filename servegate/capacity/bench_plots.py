"""PNG plots of a bench: latency CDFs, and throughput and p99 latency against the offered rate."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from servegate.capacity.bench import BenchResult
from servegate.contracts.files import write_atomic


def _pyplot():  # noqa: ANN202 - matplotlib's module
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _save(fig: object, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")  # type: ignore[attr-defined]
    return write_atomic(path, buffer.getvalue())


def latency_cdf(result: BenchResult, path: Path) -> Path:
    """CDF of TTFT and end-to-end latency (ms), one curve per run."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for run in result.runs:
        done = [r for r in run.records if r.ok]
        label = f"{run.rate_rps:g} req/s" if run.rate_rps else f"concurrency {run.concurrency}"
        for ax, values in ((axes[0], [r.ttft for r in done]), (axes[1], [r.e2el for r in done])):
            xs = np.sort(1000 * np.asarray(values))
            ax.plot(xs, np.arange(1, len(xs) + 1) / max(len(xs), 1), label=label)
    for ax, title in zip(axes, ("TTFT", "end-to-end latency"), strict=True):
        ax.set_xlabel(f"{title} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{title} CDF")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    path = _save(fig, path)
    plt.close(fig)
    return path


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
    right.plot(rates, [r.summary["e2el_ms"]["p99"] for r in runs], "s--", color="tab:red", label="p99 E2EL")
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
