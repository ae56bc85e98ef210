"""Each gate's deciding figure and its interval, read from the measurements the report writes (for the PR summary).

A gate's measurements are its own JSON shape; the figures that decide verdicts come in a few kinds, found
wherever they sit in it: a paired non-inferiority test (difference, its bounds, the margin), a boundary check
(a score, its lower bound, the floor), a capacity target (a measured value, its interval, the target), and
counts of outputs that differ. The deciding one is the first that failed, else warned, else the tightest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_RANK = {"fail": 0, "warn": 1, "unavailable": 1}


@dataclass(frozen=True)
class Figure:
    """One gate's deciding number, as the summary table shows it."""

    figure: str
    """What was measured and against what, e.g. `recall/exact_match Δ -1.000 (margin -0.03)`."""
    interval: str
    """Its confidence interval or bound, e.g. `[-1.000, -0.946] at 95%`; `—` when the gate has none."""
    verdict: str
    """The verdict of the check the figure comes from (pass when it records none)."""
    slack: float
    """How far the figure is from its limit, in the limit's units (smaller is tighter; compared within a kind)."""


NO_FIGURE = Figure("—", "—", "pass", float("inf"))


def _walk(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every mapping in a JSON value with the keys leading to it."""
    if isinstance(value, dict):
        yield path, value
        for key, item in value.items():
            yield from _walk(item, (*path, str(key)))
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item, path)


def _number(value: float, sign: str = "") -> str:
    return f"{value:{sign}.4g}" if abs(value) >= 1000 else f"{value:{sign}.3f}"


def _label(path: tuple[str, ...], record: dict[str, Any]) -> str:
    """`suite/metric` for a test inside `suites` (or any mapping), else the record's own name."""
    name = record.get("name") or record.get("metric")
    keys = [p for p in path if p not in ("suites", "contract", "boundaries", "targets", "tests")]
    if isinstance(record.get("suite"), str):
        keys.append(record["suite"])
    if name and (not keys or keys[-1].split("/")[-1] != name):
        keys.append(str(name))
    return "/".join(keys[-2:]) or "—"


def _paired(path: tuple[str, ...], r: dict[str, Any]) -> Figure:
    confidence = f" at {r['confidence']:.0%}" if isinstance(r.get("confidence"), (int, float)) else ""
    return Figure(
        f"{_label(path, r)} Δ {_number(r['difference'], '+')} (margin -{_number(r['margin'])})",
        f"[{_number(r['lower'])}, {_number(r['upper'])}]{confidence}",
        str(r.get("verdict", "pass")),
        r["lower"] + r["margin"],
    )


def _boundary(path: tuple[str, ...], r: dict[str, Any]) -> Figure:
    confidence = f" at {r['confidence']:.0%}" if isinstance(r.get("confidence"), (int, float)) else ""
    return Figure(
        f"{_label(path, r)} {_number(r['score'])} (floor {_number(r['boundary'])})",
        f"≥ {_number(r['lower'])}{confidence}",
        str(r.get("verdict", "pass")),
        r["lower"] - r["boundary"],
    )


def _target(path: tuple[str, ...], r: dict[str, Any]) -> Figure:
    unit = f" {r['unit']}" if r.get("unit") else ""
    interval = r.get("interval")
    shown = f"[{_number(interval[0])}, {_number(interval[1])}]{unit}" if isinstance(interval, list) else "—"
    # a target may be a ceiling (latency, memory) or a floor (throughput): which is tighter is not comparable,
    # so among passing targets the first declared is shown
    return Figure(
        f"{_label(path, r)} {_number(r['predicted'])}{unit} (target {_number(r['target'])}{unit})",
        shown,
        str(r.get("verdict", "pass")),
        0.0,
    )


def _differences(path: tuple[str, ...], r: dict[str, Any]) -> Figure:
    total = r.get("outputs_compared", r.get("items"))
    return Figure(f"{r['mismatches']}/{total} outputs differ", "—", "pass", -float(r["mismatches"]))


def _cached(path: tuple[str, ...], r: dict[str, Any]) -> Figure:
    return Figure(f"{r['output_mismatches']}/{r['probes']} cached outputs differ", "—", "pass", 0.0)


def _probes(path: tuple[str, ...], r: dict[str, Any]) -> Figure:
    return Figure(f"{r['probes']} probes, {r['prompts_checked']} prompts checked", "—", "pass", 0.0)


_KINDS = (
    (("difference", "lower", "upper", "margin"), _paired),
    (("score", "lower", "boundary"), _boundary),
    (("target", "predicted"), _target),
    (("mismatches", "mismatch_rate"), _differences),
    (("output_mismatches", "probes"), _cached),
    (("probes", "prompts_checked"), _probes),
)


def _numbers(record: dict[str, Any], keys: tuple[str, ...]) -> bool:
    return all(isinstance(record.get(k), (int, float)) and not isinstance(record.get(k), bool) for k in keys)


def headline(measurements: dict[str, Any]) -> Figure:
    """The figure that decided a gate: the first kind found (paired tests before boundaries, targets, counts),
    and within it the first failure, else warning, else the tightest; `NO_FIGURE` when the gate records none."""
    for keys, build in _KINDS:
        found = [build(path, r) for path, r in _walk(measurements) if _numbers(r, keys)]
        if found:
            return min(found, key=lambda f: (_RANK.get(f.verdict, 2), f.slack))
    return NO_FIGURE
