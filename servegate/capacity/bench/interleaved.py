"""Two servers benched interleaved, and the candidate/baseline ratio of a metric with its interval.

A change is judged against its baseline on the same machine at the same moments: the bench runs short
rounds, baseline and candidate taking turns (AB, BA, AB, ... so that a steady drift weighs on both sides
alike), each round sending both the same prompts in the same order at the same scheduled offsets. A
machine that slows down (another job on its cores) slows both sides of the rounds it hits and cancels
out of the ratio.

The ratio's interval is a paired bootstrap over rounds: resampling whole rounds, the same ones for both
sides, keeps each round's shared machine state in both numerator and denominator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servegate.capacity.bench.load_generator import Progress, run_closed_loop, run_open_loop
from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.bench.target_bounds import latencies_ms
from servegate.capacity.bench.targets import BenchTarget, PromptFactory
from servegate.capacity.bench.workload import make_requests
from servegate.contracts.capacity_section import Workload

RESAMPLES = 2000
"""Bootstrap resamples of the rounds."""


def default_rounds(num_requests: int) -> int:
    """Rounds for `num_requests` per side: about 10 requests a round, between 2 and 12 rounds."""
    return max(2, min(12, num_requests // 10))


class ReplayedPrompts(PromptFactory):
    """A prompt source that hands out fixed texts in order (both sides of a round get the same ones)."""

    def __init__(self, texts: Sequence[str], tokenizer: Any = None) -> None:
        super().__init__(tokenizer)
        self._texts = list(texts)
        self._next = 0

    def text(self, tokens: int) -> str:
        """The next text (its length was chosen when it was made)."""
        self._next += 1
        return self._texts[self._next - 1]


@dataclass
class InterleavedRuns:
    """The records of every round, per side, and the order the sides ran in."""

    baseline: list[list[RequestRecord]] = field(default_factory=list)
    candidate: list[list[RequestRecord]] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    """`AB` (baseline first) or `BA`, per round."""

    def pooled(self, side: str) -> list[RequestRecord]:
        """All records of one side (`baseline` or `candidate`)."""
        return [r for round_ in getattr(self, side) for r in round_]


async def run_interleaved(
    baseline: BenchTarget,
    candidate: BenchTarget,
    workload: Workload,
    prompts: PromptFactory,
    rounds: int | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> InterleavedRuns:
    """`workload.num_requests` per side, in `rounds` alternating rounds of the same requests and prompts."""
    rounds = rounds or default_rounds(workload.num_requests)
    n, extra = divmod(workload.num_requests, rounds)
    per_round = [n + (1 if i < extra else 0) for i in range(rounds)]
    out = InterleavedRuns()
    for i, count in enumerate(per_round):
        specs = make_requests(workload, seed + i, num_requests=count)
        texts = [prompts.text(spec.prompt_tokens) for spec in specs]
        order = "AB" if i % 2 == 0 else "BA"
        got: dict[str, list[RequestRecord]] = {}
        for side in order:
            target = baseline if side == "A" else candidate
            replay = ReplayedPrompts(texts, getattr(prompts, "tokenizer", None))
            if workload.arrival == "closed":
                assert workload.concurrency is not None
                got[side] = await run_closed_loop(target, specs, replay, workload.concurrency, progress)
            else:
                got[side] = await run_open_loop(target, specs, replay, progress)
        out.baseline.append(got["A"])
        out.candidate.append(got["B"])
        out.order.append(order)
    return out


Statistic = Callable[[list[list[RequestRecord]], np.ndarray], float]
"""A metric of a side, over the rounds picked by an index array (repeats allowed)."""


def percentile_statistic(target_field: str, q: float) -> Statistic:
    """The q-th percentile of `ttft_ms`, `tpot_ms` or `e2e_ms` over the picked rounds, pooled."""
    cache: dict[int, list[np.ndarray]] = {}

    def stat(rounds: list[list[RequestRecord]], picked: np.ndarray) -> float:
        per_round = cache.setdefault(id(rounds), [latencies_ms(r, target_field) for r in rounds])
        values = np.concatenate([per_round[i] for i in picked])
        return float(np.percentile(values, q)) if values.size else float("nan")

    return stat


def throughput_statistic(unit: str) -> Statistic:
    """Completed requests (or output tokens) per second over the picked rounds: sums over summed durations."""

    def stat(rounds: list[list[RequestRecord]], picked: np.ndarray) -> float:
        done = dur = 0.0
        for i in picked:
            records = rounds[i]
            ok = [r for r in records if r.ok]
            done += len(ok) if unit == "requests/s" else sum(r.output_tokens for r in ok)
            if records:
                ends = [r.end for r in ok if r.end is not None]
                dur += max(ends, default=records[0].scheduled) - min(r.scheduled for r in records)
        return done / dur if dur > 0 else 0.0

    return stat


@dataclass(frozen=True)
class Ratio:
    """candidate / baseline of one metric, with its paired-bootstrap interval."""

    baseline: float
    candidate: float
    ratio: float
    low: float
    high: float
    confidence: float

    def as_dict(self) -> dict[str, float]:
        """JSON form."""
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "ratio": self.ratio,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
        }


def paired_ratio(runs: InterleavedRuns, stat: Statistic, confidence: float = 0.95, seed: int = 0) -> Ratio:
    """The ratio of `stat` candidate/baseline over all rounds, and its interval from resampling whole rounds."""
    n = len(runs.baseline)
    every = np.arange(n)
    base, cand = stat(runs.baseline, every), stat(runs.candidate, every)
    rng = np.random.default_rng(seed)
    ratios = np.empty(RESAMPLES)
    for k, picked in enumerate(rng.integers(0, n, size=(RESAMPLES, n))):
        b = stat(runs.baseline, picked)
        ratios[k] = stat(runs.candidate, picked) / b if b > 0 else np.inf
    tail = 100 * (1 - confidence) / 2
    low, high = (float(x) for x in np.nanpercentile(ratios, [tail, 100 - tail]))
    ratio = cand / base if base > 0 else float("inf")
    return Ratio(base, cand, ratio, min(low, ratio), max(high, ratio), confidence)
