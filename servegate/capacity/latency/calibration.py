"""Profiling stage 2: the serving overheads that lone requests and bursts show beyond the model-step prediction.

Requests go through the manifest's own server: one at a time for a few prompt lengths, then bursts
batched together. What the measured inter-token gaps exceed the predicted decode step by, against batch
size, is the engine's per-step and per-sequence work (scheduling, sampling, detokenizing, streaming);
TTFT beyond the prefill step is the per-request overhead; the gap from the last token to the end of the
response is the finishing overhead. The result predicts capacity well enough to choose stage 3's loads.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from servegate.capacity.bench.load_generator import run_open_loop
from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.bench.targets import BenchTarget, PromptFactory
from servegate.capacity.bench.workload import RequestSpec
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.provenance import Calibration
from servegate.capacity.latency.serving_trace import request_overhead

CALIBRATION_BURST = 8
"""Requests batched together when measuring per-sequence serving overheads."""
BURST_SIZES = (2, 4)
"""Smaller bursts measured besides CALIBRATION_BURST, so that the gap residual is a line through several sizes."""
CALIBRATION_OUTPUT_TOKENS = 16
"""Most tokens each calibration request generates (within postprocess.max_output_tokens)."""


@dataclass(frozen=True)
class CalibrationRuns:
    """What stage 2 measured: lone requests, and requests sent in bursts (burst size -> their records)."""

    single: list[RequestRecord]
    bursts: dict[int, list[RequestRecord]]


async def measure_serving(
    target: BenchTarget,
    prompts: PromptFactory,
    prompt_tokens: Sequence[int],
    burst: int,
    output_tokens: int = CALIBRATION_OUTPUT_TOKENS,
    repeats: int = 5,
) -> CalibrationRuns:
    """Requests through the serving path: one at a time for each prompt length, then bursts of up to `burst`."""
    single: list[RequestRecord] = []
    for _ in range(repeats):
        for p in prompt_tokens:
            single += await run_open_loop(target, [RequestSpec(p, output_tokens, 0.0)], prompts)
    bursts: dict[int, list[RequestRecord]] = {}
    for size in sorted({b for b in (*BURST_SIZES, burst) if 1 < b <= burst}):
        for _ in range(max(2, repeats // 2)):
            specs = [RequestSpec(prompt_tokens[0], output_tokens, 0.0) for _ in range(size)]
            bursts.setdefault(size, []).extend(await run_open_loop(target, specs, prompts))
    return CalibrationRuns(single, bursts)


def _completed(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok and len(r.token_times) >= 2]


def calibrate(model: LatencyModel, runs: CalibrationRuns, batch_wait_s: float = 0.0) -> LatencyModel:
    """Stage 2: a new model with the serving overheads that the measured requests show beyond `model`'s steps.

    The gap residual (measured minus predicted decode step) against batch size is fitted as a line: its
    intercept is added to c_step, its slope to c_decode_seq and c_prefill_chunk. Means, not medians, are
    matched: an end-to-end latency is a sum of gaps, so occasional slow steps count in full. `batch_wait_s`
    is the batching window a lone request waited. The step jitter becomes the spread of measured gaps
    around the calibrated prediction (never less than the bare steps').
    """
    single = _completed(runs.single)
    if not single:
        raise RuntimeError("no request of the calibration run completed: cannot measure serving overheads")
    groups: dict[int, list[RequestRecord]] = {1: single}
    for size, records in runs.bursts.items():
        if (done := _completed(records)) and size > 1:
            groups[int(size)] = done
    points = [(size, _decode_residual(model, records, size)) for size, records in sorted(groups.items())]
    if len(points) > 1:
        slope, intercept = np.polyfit([b for b, _ in points], [r for _, r in points], 1)
        e1 = max(0.0, float(slope))
        e0 = max(0.0, float(intercept) + (float(slope) - e1))  # a clipped slope moves its share to the intercept
    else:
        e1, e0 = 0.0, max(0.0, points[0][1])
    stepped = replace(model, steps=model.steps.plus(c_step=e0, c_decode_seq=e1, c_prefill_chunk=e1))
    ratios = [
        gap / stepped.decode_time(batch, max(2, r.prompt_tokens) + i + 1)
        for batch, records in groups.items()
        for r in records
        for i, gap in enumerate(r.itls)
    ]
    overheads = replace(
        model.overheads,
        request_s=request_overhead(stepped, single, batch_wait_s),
        finish_s=max(0.0, statistics.median([r.end - r.token_times[-1] for r in single if r.end])),
    )
    spread = max(model.jitter.spread, float(np.std(ratios) / max(np.mean(ratios), 1e-9)))
    found = Calibration(e0, e1, sum(len(records) for records in groups.values()), tuple(points))
    return replace(
        stepped, overheads=overheads, jitter=replace(model.jitter, spread=spread),
        fit=replace(model.fit, calibration=found),
    )  # fmt: skip


def _decode_residual(model: LatencyModel, records: Sequence[RequestRecord], batch: int) -> float:
    """Mean measured inter-token gap minus the mean predicted decode step for `batch` sequences, seconds."""
    gaps, predicted = [], []
    for r in records:
        p = max(2, r.prompt_tokens)
        for i, gap in enumerate(r.itls):
            gaps.append(gap)
            predicted.append(model.decode_time(batch, p + i + 1))
    return statistics.fmean(gaps) - statistics.fmean(predicted)
