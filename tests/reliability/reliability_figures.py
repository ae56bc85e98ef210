"""The figures the reliability tests measure, collected per test and printed as one table at the end.

A test asks for the `figures` fixture and records what it measured: counts (`figures.count("sent", 300)`),
plain values (`figures.set("engine", "reference")`) and timing samples (`figures.timings("ttft_s", [...])`,
summarised as n / p50 / p95 / max). The conftest plugin prints every test's figures after the session
and, when SERVEGATE_RELIABILITY_JSON names a file, writes them there as JSON (docs/reliability.md is
written from that file).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between order statistics."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class TestFigures:
    """What one test measured."""

    test: str
    values: dict[str, Any] = field(default_factory=dict)
    """Figure name -> number or short text, in the order recorded."""
    samples: dict[str, list[float]] = field(default_factory=dict)
    """Timing name -> samples in seconds."""

    def set(self, name: str, value: Any) -> None:
        """Record (or replace) one figure."""
        self.values[name] = value

    def count(self, name: str, increment: int = 1) -> None:
        """Add to a counter figure (created at 0)."""
        self.values[name] = int(self.values.get(name, 0)) + increment

    def timings(self, name: str, seconds: list[float] | tuple[float, ...]) -> None:
        """Record timing samples in seconds (extends earlier samples of the same name)."""
        self.samples.setdefault(name, []).extend(float(s) for s in seconds)

    def rows(self) -> list[tuple[str, str]]:
        """(figure, value) rows for the summary table; timings as n, p50, p95 and max in ms."""
        rows = [(name, _show(value)) for name, value in self.values.items()]
        for name, values in self.samples.items():
            shown = (
                f"n={len(values)} p50={1000 * _percentile(values, 50):.2f} ms "
                f"p95={1000 * _percentile(values, 95):.2f} ms max={1000 * max(values):.2f} ms"
                if values
                else "n=0"
            )
            rows.append((name, shown))
        return rows

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON (timings summarised, raw samples dropped)."""
        timings = {
            name: {
                "n": len(v),
                "p50_ms": 1000 * _percentile(v, 50),
                "p95_ms": 1000 * _percentile(v, 95),
                "max_ms": 1000 * max(v) if v else None,
                "mean_ms": 1000 * statistics.fmean(v) if v else None,
            }
            for name, v in self.samples.items()
        }
        return {"test": self.test, "figures": dict(self.values), "timings": timings}


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class FigureBook:
    """Every test's figures in this session, in the order the tests ran."""

    def __init__(self) -> None:
        self.tests: dict[str, TestFigures] = {}
        self.reliability_tests_run = 0

    def for_test(self, nodeid: str) -> TestFigures:
        """The figures of one test (created on first use)."""
        return self.tests.setdefault(nodeid, TestFigures(nodeid))

    def lines(self) -> list[str]:
        """The summary table as text lines: test, figure, value."""
        rows = [(t.test.split("::", 1)[-1], name, value) for t in self.tests.values() for name, value in t.rows()]
        if not rows:
            return []
        widths = [max(len(r[i]) for r in rows + [("test", "figure", "value")]) for i in range(2)]
        out = [f"{'test':<{widths[0]}}  {'figure':<{widths[1]}}  value"]
        out.append("-" * (widths[0] + widths[1] + 9))
        last = None
        for test, name, value in rows:
            shown = test if test != last else ""
            out.append(f"{shown:<{widths[0]}}  {name:<{widths[1]}}  {value}")
            last = test
        return out

    def write_json(self, path: Path, **context: Any) -> None:
        """Write every test's figures to `path` (atomically), with `context` (e.g. the model served)."""
        payload = {**context, "tests": [t.to_json() for t in self.tests.values() if t.values or t.samples]}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
        tmp.replace(path)
