"""Weight memory from a Hugging Face config alone (no weights downloaded), by dtype and quantization.

Parameters are counted by building the model on PyTorch's `meta` device with transformers' own
modeling code: every architecture transformers knows is counted exactly, and nothing is allocated.
Each parameter is then priced by what the runtime stores for it:

    float32 4 B, float16/bfloat16 2 B
    int8-weight / int8-dynamic / fp8-weight: 1 B per weight + one scale per output row
    int4-weight: 0.5 B per weight + a scale and a zero point per group of `group_size` weights
    int3-weight / int2-weight: simulated (round-tripped), so stored at the compute dtype: no saving

Only the linear layers' weights are quantized; embeddings and lm_head stay in the compute dtype unless
the quantization asks for them (as the runtime does).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servegate.runtime.model.kv_memory import DTYPE_BYTES

SIMULATED_METHODS = frozenset({"int3-weight", "int2-weight"})
"""Quantizations the runtime simulates by round-tripping: no memory is saved."""

_SCALE_BYTES = 2  # scales and zero points are kept in 16-bit


@dataclass(frozen=True)
class WeightsMemory:
    """What the weights of one model occupy, split into what quantization touches and what it leaves."""

    parameters: int
    """Total parameter count."""
    quantized_parameters: int
    """Parameters stored in the quantized format (linear weights chosen by the quantization)."""
    bytes: int
    """Bytes the runtime holds for all parameters, scales included."""
    dtype: str
    """Compute dtype of the unquantized parameters."""
    quantization: str
    """Quantization method (`none` when unquantized; `gguf Q8_0` and the like for a GGUF llama.cpp maps as stored)."""
    simulated: bool = False
    """True when the quantization is simulated, so it saves no memory."""
    linear_bytes: int = 0
    """Bytes of the linear layers' and LM head's weights (the matrices a decode step multiplies)."""

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able form."""
        return asdict(self)


@dataclass(frozen=True)
class _Tensor:
    numel: int
    out_features: int
    kind: str  # "linear" | "embedding" | "lm_head" | "other"


def read_config(path: str | Path) -> dict[str, Any]:
    """Read a config.json (a file, or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"no config.json at {p}")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: a config.json holds a JSON object")
    return data


def _meta_tensors(config: dict[str, Any]) -> tuple[_Tensor, ...]:
    """Every parameter of the model the config describes, classified (built once per config)."""
    return _meta_tensors_of(json.dumps(config, sort_keys=True, default=str))


@functools.lru_cache(maxsize=16)
def _meta_tensors_of(config_json: str) -> tuple[_Tensor, ...]:
    """Build the model on the meta device and classify its parameters."""
    config = json.loads(config_json)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type = config.get("model_type")
    if not model_type:
        raise ValueError("config has no model_type: cannot build the model to count its parameters")
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "auto_map")}
    try:
        hf_config = AutoConfig.for_model(model_type, **fields)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"transformers does not know model_type {model_type!r}: {exc}") from None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    out_embeddings = model.get_output_embeddings()
    tensors: list[_Tensor] = []
    seen: set[int] = set()  # tied weights are stored once
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if module is out_embeddings:
                kind = "lm_head"
            elif isinstance(module, torch.nn.Embedding):
                kind = "embedding"
            elif isinstance(module, torch.nn.Linear) and name == "weight":
                kind = "linear"
            else:
                kind = "other"
            tensors.append(_Tensor(param.numel(), int(param.shape[0]) if param.dim() >= 1 else 1, kind))
    return tuple(tensors)


def weights_memory(
    config: dict[str, Any],
    dtype: str = "float32",
    quantization: str = "none",
    group_size: int = 32,
    include_lm_head: bool = False,
    include_embeddings: bool = False,
) -> WeightsMemory:
    """Bytes of the weights a config describes at `dtype` under `quantization` (see the module notes)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    base = DTYPE_BYTES[dtype]
    simulated = quantization in SIMULATED_METHODS
    total = quantized = 0
    nbytes = linear_bytes = 0
    for t in _meta_tensors(config):
        total += t.numel
        if t.kind in ("linear", "lm_head"):
            linear_bytes += t.numel * base
        chosen = t.kind == "linear" or (t.kind == "lm_head" and include_lm_head)
        chosen = chosen or (t.kind == "embedding" and include_embeddings)
        if quantization == "none" or simulated or not chosen:
            nbytes += t.numel * base
            continue
        quantized += t.numel
        if quantization == "int4-weight":
            groups = -(-t.numel // group_size)
            nbytes += -(-t.numel // 2) + groups * 2 * _SCALE_BYTES
        elif quantization in ("int8-weight", "int8-dynamic", "fp8-weight"):
            nbytes += t.numel + t.out_features * _SCALE_BYTES
        else:
            raise ValueError(f"unknown quantization method {quantization!r}")
    return WeightsMemory(total, quantized, nbytes, dtype, quantization, simulated, linear_bytes)
