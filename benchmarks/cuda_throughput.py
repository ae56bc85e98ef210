"""The CUDA side of runtime_throughput.py (`--device cuda`): the ~1.1B random Llama in bfloat16, the HBM
roofline of batch-1 decode, and the JSON record of a run.

The model has TinyLlama-1.1B's shape (hidden 2048, 22 layers, 32 query and 4 KV heads, intermediate 5632,
vocab 32000), random weights from a fixed seed, built directly on the GPU. Batch-1 decode reads every
weight but the input embeddings once per token, so its ceiling is that many bytes at the HBM copy rate:
4.3 TB/s counting bytes read and written, as measured on this workplace's H200 (a device-to-device copy of
8.6 GB in 2.0 ms); the script also measures the copy rate on the GPU it runs on and prints both ceilings.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

H200_COPY_BYTES_PER_S = 4.3e12
"""Device-to-device copy rate of the H200 this workplace lends (read + write bytes per second)."""
LLAMA_1B = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}


def build_llama_1b(dtype: torch.dtype, device: str = "cuda") -> Any:
    """The seeded random 1.1B Llama on `device` in `dtype`, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA_1B))
    return model.to(dtype).eval()


def gpu_copy_bandwidth(nbytes: int = 2**30, repeats: int = 10) -> float:
    """Best device-to-device copy rate of `repeats` copies of `nbytes`, bytes/s (read + write counted)."""
    src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = max(best, 2 * nbytes / (time.perf_counter() - start))
    return best


def roofline_lines(tokens_per_s: list[float], step_bytes: int, measured_copy: float) -> tuple[list[str], dict]:
    """Printed lines and JSON of batch-1 decode runs against the HBM ceilings (4.3 TB/s and the measured copy)."""
    ceiling, measured_ceiling = H200_COPY_BYTES_PER_S / step_bytes, measured_copy / step_bytes
    lines = [
        f"batch-1 decode through the engine: {t:.1f} tokens/s; roofline {ceiling:.0f} tokens/s at 4.3 TB/s "
        f"({step_bytes / 1e9:.2f} GB of weights per token) -> {t / ceiling:.1%}; {measured_ceiling:.0f} tokens/s at "
        f"the {measured_copy / 1e12:.2f} TB/s copy measured here -> {t / measured_ceiling:.1%}"
        for t in tokens_per_s
    ]
    record = {
        "tokens_per_s": tokens_per_s,
        "weight_bytes_per_token": step_bytes,
        "roofline_tokens_per_s_at_4_3_tb_s": ceiling,
        "measured_copy_bytes_per_s": measured_copy,
        "roofline_tokens_per_s_at_measured_copy": measured_ceiling,
    }
    return lines, record


def write_json(path: Path, args: Any, model: Any, outcomes: list[Any], batch1: dict[str, Any]) -> None:
    """The run's settings, every system's figures per arrival pattern, and batch-1 decode, as JSON."""
    record = {
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": args.dtype,
        "parameters": sum(p.numel() for p in model.parameters()),
        "requests": args.requests,
        "runs": [
            {
                "pattern": o.pattern,
                "system": o.system,
                "output_tokens_per_s": o.tokens_per_s,
                "p50_e2e_s": o.percentile(50),
                "p99_e2e_s": o.percentile(99),
                "wall_s": o.wall_s,
                "useful_tokens": o.useful_tokens,
            }
            for o in outcomes
        ],
        "batch1_decode": batch1,
    }
    path.write_text(json.dumps(record, indent=2) + "\n")
