"""The simulator against the real reference engine (its loop, scheduler, sampler and streaming), driving a
model runner whose steps take a known time: the profile must recover the step costs, and predicted
end-to-end latencies must match measured ones at two loads within the accuracy target (p50 10%, p99 15%).

Measured on the shared 2-core machine: passes with load average ~5; at load 8-9 (other engineers' jobs
starting between calibration and measurement) p50 errors of 11-18% were seen, hence `slow`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from servegate.capacity.bench.load_generator import run_open_loop
from servegate.capacity.bench.run_metrics import summarize
from servegate.capacity.bench.targets import EngineTarget, PromptFactory
from servegate.capacity.bench.workload import make_requests
from servegate.capacity.latency.calibration import calibrate, measure_serving
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.profile import fit_model_steps, profiling_variant
from servegate.capacity.latency.simulate import SimSetup, simulate
from servegate.capacity.latency.step_timing import ProfileLimits, step_grid, time_steps
from servegate.capacity.latency.terms import StepCost
from servegate.contracts.capacity_section import Workload
from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.reference import ReferenceEngine
from servegate.runtime.types import GenerationRequest, SeqChunk

TRUTH = LatencyModel(StepCost(c_step=0.004, c_prefill_token=0.00005, c_decode_seq=0.0006))
VOCAB = 16


class SleepRunner:
    """A ModelRunner that takes TRUTH's step time and always proposes token 5."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size, self.vocab_size = num_blocks, block_size, VOCAB
        self.eos_token_ids = frozenset({2})

    def execute(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        time.sleep(TRUTH.step_time((len(c.token_ids), c.start_pos) for c in chunks))
        logits = torch.zeros(len(chunks), VOCAB)
        logits[:, 5] = 1.0
        return logits


class LetterTokenizer:
    eos_token_id = 2
    all_special_ids = [0, 1, 2, 3]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "a" * sum(1 for i in ids if i not in self.all_special_ids)


@dataclass
class Encoded:
    token_ids: list[int]
    truncated_tokens: int


class CharPreprocessor:
    """One token per prompt character."""

    vocab_size = 64

    def encode(self, request: GenerationRequest) -> Encoded:
        return Encoded([6] * len(request.prompt or ""), 0)


def sampler(logits: torch.Tensor, params: list, generators: list) -> tuple[torch.Tensor, torch.Tensor]:
    return logits.argmax(-1), torch.zeros(len(params))


def manifest() -> ServedModel:
    return ServedModel.model_validate(
        {
            "name": "timed",
            "weights": {"source": "zoo:tiny-primary"},
            "preprocess": {"max_input_tokens": 64},
            "postprocess": {"max_output_tokens": 32},
            "runtime": {"max_model_len": 128, "kv_cache": {"block_size": 16, "memory_budget": "1MiB"}},
            "batching": {"mode": "continuous", "max_batch_size": 16, "max_num_batched_tokens": 512},
        }
    )


def engine(served: ServedModel) -> ReferenceEngine:
    e = ReferenceEngine(
        served, runner=SleepRunner(512, 16), tokenizer=LetterTokenizer(), preprocessor=CharPreprocessor(),
        sampler=sampler,
    )  # fmt: skip
    e.start_sync()
    return e


@pytest.mark.slow  # ~25 s, and its 10%/15% tolerances need a machine that is not oversubscribed
def test_profile_recovers_step_costs_and_simulation_matches_the_engine_at_two_loads() -> None:
    served = manifest()
    # stage 1: step times of the runner alone
    grid = step_grid(ProfileLimits(64, 16, 512, 128), 512, 16)
    model = fit_model_steps(time_steps(SleepRunner(512, 16), grid, repeats=3))
    for chunks in ([(48, 0)], [(1, 63)] * 12, [(32, 0), *([(1, 40)] * 6)]):
        assert model.step_time(chunks) == pytest.approx(TRUTH.step_time(chunks), rel=0.15)

    # stage 2: serving overheads through the engine
    variant = engine(profiling_variant(served, 8))
    try:
        runs = asyncio.run(measure_serving(EngineTarget(variant), PromptFactory(chars_per_token=1), [16, 48], 8, 16))
    finally:
        variant.shutdown_sync(1.0)
    model = calibrate(model, runs, batch_wait_s=0.05)

    # two loads: light, and about half of what the engine sustains
    setup = SimSetup.from_manifest(served, 512, 16)
    errors = {}
    for rate in (8.0, 40.0):
        workload = Workload.model_validate(
            {"input_tokens": {"distribution": "uniform", "mean": 32, "min": 8, "max": 56},
             "output_tokens": {"distribution": "uniform", "mean": 8, "min": 4, "max": 12},
             "rate_rps": rate, "num_requests": 80}
        )  # fmt: skip
        specs = make_requests(workload, seed=3)
        live = engine(served)
        try:
            records = asyncio.run(run_open_loop(EngineTarget(live), specs, PromptFactory(chars_per_token=1)))
        finally:
            live.shutdown_sync(1.0)
        measured = summarize(records)
        predicted = np.median(
            [[simulate(setup, model, specs, seed=s).summary()["e2el_ms"][p] for p in ("p50", "p99")] for s in range(5)],
            axis=0,
        )
        errors[rate] = [abs(pred - measured["e2el_ms"][p]) / measured["e2el_ms"][p] for pred, p in
                        zip(predicted, ("p50", "p99"), strict=True)]  # fmt: skip
        assert measured["requests"]["completed"] == 80
        print(f"{rate} requests/s: predicted p50/p99 {predicted[0]:.1f}/{predicted[1]:.1f} ms, measured "
              f"{measured['e2el_ms']['p50']:.1f}/{measured['e2el_ms']['p99']:.1f} ms")  # fmt: skip
    for rate, (p50, p99) in errors.items():
        assert p50 <= 0.10, f"p50 end-to-end error {p50:.1%} at {rate} requests/s"
        assert p99 <= 0.15, f"p99 end-to-end error {p99:.1%} at {rate} requests/s"
