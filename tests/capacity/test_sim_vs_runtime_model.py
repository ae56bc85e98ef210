"""The simulator against the reference runtime running a real (tiny, random-weight) Llama in this process:
profile its steps, calibrate serving overheads, then predicted vs measured end-to-end latency at two loads.
Uses the zoo's tiny-primary when it has been built, else a random Llama with the zoo's character tokenizer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from servegate.capacity.bench.load_generator import run_open_loop
from servegate.capacity.bench.run_metrics import summarize
from servegate.capacity.bench.targets import EngineTarget, PromptFactory
from servegate.capacity.bench.workload import make_requests
from servegate.capacity.latency.calibration import calibrate, measure_serving
from servegate.capacity.latency.prediction import sim_setup
from servegate.capacity.latency.profile import fit_model_steps, profiling_variant
from servegate.capacity.latency.simulate import simulate
from servegate.capacity.latency.step_timing import ProfileLimits, step_grid, time_steps
from servegate.contracts.capacity_section import Workload
from servegate.contracts.manifest import ServedModel
from servegate.runtime import build


def model_source(tmp_path: Path) -> str:
    try:
        from servegate.zoo.catalog import zoo_model_path

        zoo_model_path("tiny-primary")
        return "zoo:tiny-primary"
    except Exception:  # not built in this checkout: a random model of the same family
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from servegate.zoo.tokenizer import build_char_tokenizer

        torch.manual_seed(0)
        tokenizer = build_char_tokenizer()
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0)  # fmt: skip
        LlamaForCausalLM(config).save_pretrained(tmp_path / "model")
        tokenizer.save_pretrained(tmp_path / "model")
        return str(tmp_path / "model")


@pytest.mark.slow  # ~1 min; its 10%/15% tolerances need a machine that is not oversubscribed
def test_simulation_matches_the_runtime_on_the_tiny_model_at_two_loads(tmp_path: Path) -> None:
    served = ServedModel.model_validate(
        {
            "name": "tiny",
            "weights": {"source": model_source(tmp_path)},
            "preprocess": {"max_input_tokens": 64, "chat_template": "none"},
            "postprocess": {"max_output_tokens": 32},
            "runtime": {"device": "cpu", "dtype": "float32", "max_model_len": 128, "threads": 1,
                        "kv_cache": {"block_size": 16, "memory_budget": "8MiB"}},
            "batching": {"mode": "continuous", "max_batch_size": 16, "max_num_batched_tokens": 512},
        }
    )  # fmt: skip
    variant = build(profiling_variant(served, 8), fallback=False)
    variant.start_sync()  # type: ignore[attr-defined]
    try:
        runner = variant.parts.runner  # type: ignore[attr-defined]
        grid = step_grid(ProfileLimits(64, 32, 512, 128), runner.num_blocks, runner.block_size)
        model = fit_model_steps(time_steps(runner, grid, repeats=5))
        tokenizer = variant.parts.tokenizer  # type: ignore[attr-defined]
        runs = asyncio.run(measure_serving(EngineTarget(variant), PromptFactory(tokenizer), [16, 64], 8, 16))
    finally:
        variant.shutdown_sync(1.0)  # type: ignore[attr-defined]
    model = calibrate(model, runs, batch_wait_s=0.05)
    setup = sim_setup(served)
    for rate in (4.0, 12.0):
        workload = Workload.model_validate(
            {"input_tokens": {"distribution": "uniform", "mean": 36, "min": 8, "max": 64},
             "output_tokens": {"distribution": "uniform", "mean": 12, "min": 4, "max": 20},
             "rate_rps": rate, "num_requests": 80}
        )  # fmt: skip
        specs = make_requests(workload, seed=5)
        live = build(served, fallback=False)
        live.start_sync()  # type: ignore[attr-defined]
        try:
            records = asyncio.run(run_open_loop(EngineTarget(live), specs, PromptFactory(tokenizer)))
        finally:
            live.shutdown_sync(1.0)  # type: ignore[attr-defined]
        measured = summarize(records)["e2el_ms"]
        sims = [simulate(setup, model, specs, seed=s).summary()["e2el_ms"] for s in range(5)]
        predicted = {p: float(np.median([s[p] for s in sims])) for p in ("p50", "p99")}
        print(f"{rate} requests/s: predicted p50/p99 {predicted['p50']:.1f}/{predicted['p99']:.1f} ms, "
              f"measured {measured['p50']:.1f}/{measured['p99']:.1f} ms")  # fmt: skip
        assert measured["count"] == 80
        assert abs(predicted["p50"] - measured["p50"]) / measured["p50"] <= 0.10
        assert abs(predicted["p99"] - measured["p99"]) / measured["p99"] <= 0.15
