"""The capacity gate's verdicts that a moving machine cannot fool: paired ratios for a change, bounds for targets.

- A change (`gate check --baseline A --candidate B`): both servers are benched interleaved on this
  machine (capacity/bench/interleaved.py) and the candidate/baseline ratio of each target metric is gated
  with its 95% interval against `capacity.tolerance`: fail when the whole interval is worse than the
  tolerance allows, pass when the whole interval is within it, warn (inconclusive) when it straddles.
- Absolute latency targets: judged on the sample's conservative estimate and interval
  (capacity/bench/target_bounds.py): pass, fail or inconclusive with the requests that would decide it.
- Throughput floors and the memory budget stay point checks (they are not percentiles of a sample).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from servegate.capacity.bench.interleaved import (
    InterleavedRuns,
    Ratio,
    Statistic,
    paired_ratio,
    percentile_statistic,
    run_interleaved,
    throughput_statistic,
)
from servegate.capacity.bench.load_generator import BenchResult, BenchRun
from servegate.capacity.bench.run_metrics import SLO, RequestRecord, summarize
from servegate.capacity.bench.target_bounds import LATENCY_TARGETS, BoundCheck, judge_latency_targets
from servegate.capacity.bench.targets import HttpTarget, PromptFactory
from servegate.capacity.planning.target_checks import TargetCheck, check_targets
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel

VerdictName = Literal["pass", "fail", "warn"]


def paired_mode(mode: str, baseline: ServedModel, candidate: ServedModel) -> bool:
    """Whether the gate judges a change against its baseline (a change whose two sides serve differently, or
    two remote deployments: the fingerprint leaves their URLs out, but they are two servers to compare)."""
    moved = baseline.runtime.endpoint_url != candidate.runtime.endpoint_url
    return mode == "change" and (baseline.fingerprint != candidate.fingerprint or moved)


@dataclass(frozen=True)
class RatioCheck:
    """One target metric of a change: candidate/baseline with its interval, against the tolerance."""

    name: str
    ratio: Ratio
    tolerance: float
    higher_is_better: bool

    @property
    def verdict(self) -> VerdictName:
        """fail: the whole interval is worse than the tolerance; pass: all of it within; warn: it straddles."""
        r, t = self.ratio, self.tolerance
        if self.higher_is_better:  # a floor: the candidate may lose at most `t` of the baseline's
            return "fail" if r.high < 1 - t else ("pass" if r.low >= 1 - t else "warn")
        return "fail" if r.low > 1 + t else ("pass" if r.high <= 1 + t else "warn")

    def sentence(self) -> str:
        """One line with the ratio, its interval and the verdict."""
        r = self.ratio
        limit = 1 - self.tolerance if self.higher_is_better else 1 + self.tolerance
        bound = f"{'at least' if self.higher_is_better else 'at most'} {limit:.2f}x"
        head = (
            f"{self.name} candidate/baseline {r.ratio:.2f}x ({100 * r.confidence:g}% interval {r.low:.2f}-"
            f"{r.high:.2f}x; baseline {r.baseline:.4g}, candidate {r.candidate:.4g}; allowed {bound})"
        )
        return head + {"pass": ": within the tolerance", "fail": ": worse beyond the tolerance",
                       "warn": ": inconclusive"}[self.verdict]  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "name": self.name,
            "verdict": self.verdict,
            "tolerance": self.tolerance,
            "higher_is_better": self.higher_is_better,
            **self.ratio.as_dict(),
        }


def ratio_statistics(targets: Any) -> list[tuple[str, Statistic, bool]]:
    """(name, statistic, higher is better) for each declared latency percentile and throughput floor."""
    out: list[tuple[str, Statistic, bool]] = []
    for field in LATENCY_TARGETS:
        pct = getattr(targets, field)
        for p in ("p50", "p95", "p99"):
            if pct is not None and getattr(pct, p) is not None:
                out.append((f"{field}.{p}", percentile_statistic(field, float(p[1:])), False))
    if targets.throughput is not None:
        unit = targets.throughput.unit
        out.append((f"throughput.{unit}", throughput_statistic(unit), True))
    return out


def ratio_checks(runs: InterleavedRuns, targets: Any, tolerance: float) -> list[RatioCheck]:
    """The ratio check of every target metric over interleaved runs."""
    return [
        RatioCheck(name, paired_ratio(runs, stat, seed=i), tolerance, higher)
        for i, (name, stat, higher) in enumerate(ratio_statistics(targets))
    ]


async def bench_interleaved(
    baseline_url: str,
    candidate_url: str,
    baseline: ServedModel,
    candidate: ServedModel,
    prompts: PromptFactory,
    progress: Any = None,
) -> InterleavedRuns:
    """Probe both servers, then bench them interleaved at the candidate's declared workload."""
    workload = candidate.capacity.workload
    assert workload is not None
    base, cand = HttpTarget.for_manifest(baseline_url, baseline), HttpTarget.for_manifest(candidate_url, candidate)
    try:
        await base.probe()
        await cand.probe()
        return await run_interleaved(base, cand, workload, prompts, progress=progress)
    except ConnectionError as exc:
        raise ServegateError(str(exc)) from None
    finally:
        await base.aclose()
        await cand.aclose()


def as_bench_result(
    runs: InterleavedRuns, workload: Any, slo: SLO, target: str, side: str = "candidate"
) -> BenchResult:
    """One side of an interleaved bench as one run of a BenchResult (its report, its checks).

    Throughput counts that side's own rounds only: pooled, the other side's turns would count as idle time.
    """
    records = runs.pooled(side)
    rounds = getattr(runs, side)
    result = BenchResult(workload, slo=slo, target=target, ignore_eos=True)
    summary = summarize(records, slo, intervals=True)
    every = np.arange(len(rounds))
    rps = throughput_statistic("requests/s")(rounds, every)
    summary["throughput"] = {
        "requests_per_s": rps,
        "output_tokens_per_s": throughput_statistic("tokens/s")(rounds, every),
    }
    completed = summary["requests"]["completed"]
    if completed:  # the same share of the completed requests met the SLO, at the rounds' own rate
        summary["goodput"]["requests_per_s"] = rps * summary["goodput"]["fraction"] * len(records) / completed
    result.runs.append(BenchRun(records, summary, workload.rate_rps, workload.concurrency))
    return result


@dataclass(frozen=True)
class ChangeBench:
    """What an interleaved bench of a change measured: each side as a BenchResult, and the ratio checks."""

    candidate: BenchResult
    baseline: BenchResult
    ratios: list[RatioCheck]


def bench_change_sides(runs: InterleavedRuns, served: ServedModel, slo: SLO, candidate_url: str) -> ChangeBench:
    """Both sides of an interleaved bench and the ratio check of each of the candidate's target metrics."""
    workload, capacity = served.capacity.workload, served.capacity
    return ChangeBench(
        as_bench_result(runs, workload, slo, candidate_url),
        as_bench_result(runs, workload, slo, "baseline", side="baseline"),
        ratio_checks(runs, capacity.targets, capacity.tolerance),
    )


BASELINE_MISSES_TOO = (
    "; the baseline misses it too, in the same interleaved bench: this machine, now, not the change "
    "(the ratio to the baseline decides)"
)


OVERSUBSCRIBED = (
    "; this machine was oversubscribed during the bench (load average {peak:.1f} on {cpus} CPUs): the miss "
    "may be the machine's, not the server's; bench it on a quiet machine or gate the change against its "
    "baseline (--baseline), which is benched beside it"
)


@dataclass(frozen=True)
class CapacityVerdict:
    """The gate's verdict, its reason and the checks behind it."""

    verdict: VerdictName
    reason: str
    checks: list[dict[str, Any]]


def judge(
    targets: Any,
    records: Sequence[RequestRecord],
    point_checks: Sequence[TargetCheck],
    change: ChangeBench | None = None,
    describe_miss: Callable[[TargetCheck], str] | None = None,
    load: dict[str, Any] | None = None,
) -> CapacityVerdict:
    """Latency targets on their bounds, throughput and memory on their points, a change's ratios; the worst wins.

    For a change, an absolute target that the baseline misses as well in the same interleaved bench is only a
    warning: the machine missed it, and the ratio decides whether the change did. `describe_miss` words a
    missed point check (default: its own sentence). Without a baseline, a latency or throughput target missed
    while the machine was oversubscribed (`load`: the bench's load_average) is a warning too: other work
    shared the cores with the server, and only a baseline benched beside it could tell the two apart."""
    bounds: list[BoundCheck] = judge_latency_targets(targets, records)
    latency_names = {b.name for b in bounds}
    points = [c for c in point_checks if c.name not in latency_names]
    base_misses: set[str] = set()
    if change is not None:
        base_records = [r for run in change.baseline.runs for r in run.records]
        base_misses = {b.name for b in judge_latency_targets(targets, base_records) if b.verdict == "fail"}
        base_misses |= {c.name for c in check_targets(targets, change.baseline.as_dict(), None) if not c.met}
    entries: list[tuple[VerdictName, str, dict[str, Any]]] = []
    for b in bounds:
        entries.append(_unless_baseline_too(b.verdict, b.sentence(), b.as_dict(), b.name in base_misses))
    for c in points:
        point: VerdictName = "pass" if c.met else "fail"
        text = describe_miss(c) if describe_miss is not None and not c.met else c.sentence()
        entries.append(_unless_baseline_too(point, text, {**c.as_dict(), "verdict": point}, c.name in base_misses))
    for r in change.ratios if change is not None else ():
        entries.append((r.verdict, r.sentence(), {**r.as_dict(), "kind": "ratio"}))
    if change is None and load is not None and load.get("oversubscribed"):
        busy = OVERSUBSCRIBED.format(peak=max(load["before"], load["after"]), cpus=load["cpus"])
        entries = [
            ("warn", text + busy, {**data, "verdict": "warn", "machine_oversubscribed": True})
            if verdict == "fail" and data.get("name") != "memory"
            else (verdict, text, data)
            for verdict, text, data in entries
        ]
    verdicts = [v for v, _, _ in entries]
    worst: VerdictName = "fail" if "fail" in verdicts else ("warn" if "warn" in verdicts else "pass")
    shown = [text for v, text, _ in entries if v == worst] if worst != "pass" else []
    return CapacityVerdict(worst, "; ".join(shown), [d for _, _, d in entries])


def _unless_baseline_too(
    verdict: VerdictName, text: str, data: dict[str, Any], baseline_misses: bool
) -> tuple[VerdictName, str, dict[str, Any]]:
    """A failed absolute target becomes a warning when the baseline failed it too in the same bench."""
    if verdict != "fail" or not baseline_misses:
        return verdict, text, data
    return "warn", text + BASELINE_MISSES_TOO, {**data, "verdict": "warn", "baseline_misses_too": True}
