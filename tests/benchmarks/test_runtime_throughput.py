"""benchmarks/runtime_throughput.py's servegate side (what vllm_throughput.py and the GPU benchmark run too): a
pre-tokenized workload through the reference engine. Fast, so a runtime change that breaks the benchmark shows in
the default suite: an engine check of the built request's ids once made the id-only preprocessor fail here."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_a_tiny_workload_runs_through_the_reference_engine_to_its_requested_lengths() -> None:
    from runtime_throughput import KV_BUDGET_BYTES, run_servegate, servegate_engine, workload

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    engine = servegate_engine(model, "continuous", 4, KV_BUDGET_BYTES, 256, 1, "torch")
    try:
        jobs = workload(6, None, cfg.vocab_size, prompt=(4, 24), out=(2, 8))
        wall_s, e2e = run_servegate(engine, jobs)  # asserts each job's completion_tokens == its output_len
    finally:
        engine.shutdown_sync(1.0)
    assert wall_s > 0 and len(e2e) == 6 and all(0 < t <= wall_s for t in e2e)
