"""What a live deployment says about itself, and what the manifest says it should say.

Read-only and cheap: the model list, the engine's version, vLLM's cache configuration from /metrics, and the
KV blocks the manifest's budget buys (to compare with the blocks the engine allocated).
"""

from __future__ import annotations

from typing import Any

from servegate.contracts.manifest import ServedModel

CACHE_INFO = "vllm:cache_config_info"
"""vLLM's info gauge whose labels are its CacheConfig (block_size, cache_dtype, enable_prefix_caching, ...)."""


def cache_config_labels(metrics_text: str) -> dict[str, str] | None:
    """The labels of vLLM's cache_config_info gauge in a Prometheus exposition (None when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(metrics_text))
    except ValueError:
        return None
    for family in families:
        for sample in family.samples:
            if sample.name == CACHE_INFO:
                return dict(sample.labels)
    return None


def engine_from_answers(version: Any, info: Any, server_header: str | None) -> tuple[str | None, str | None]:
    """(engine name, version) from vLLM's /version, another engine's /info, or the `server` header."""
    if isinstance(version, dict) and isinstance(version.get("version"), str):
        return "vllm", version["version"]
    if isinstance(info, dict) and info.get("version") is not None:
        name = "text-generation-inference" if "model_id" in info else str(info.get("name") or info.get("engine") or "")
        return (name or None), str(info["version"])
    if server_header:
        name, _, rest = server_header.partition("/")
        return name.strip().lower() or None, (rest.split()[0] if rest else None)
    return None, None


def declared_engine(served: ServedModel) -> tuple[str | None, str | None]:
    """(name, version) of the engine the manifest declares, when its runtime has an `engine` section."""
    engine = getattr(served.runtime, "engine", None)
    if engine is None:
        return None, None
    name, version = getattr(engine, "name", None), getattr(engine, "version", None)
    return (str(name) if name else None), (str(version) if version else None)


def _compute_dtype(served: ServedModel) -> str | None:
    rt = served.runtime
    dtype = rt.dtype if rt.dtype != "auto" else served.weights.dtype
    if dtype != "auto":
        return dtype
    return {"cpu": "float32", "cuda": "bfloat16"}.get(rt.device)


def expected_kv_blocks(served: ServedModel) -> int | None:
    """KV blocks one engine worker gets from the manifest's budget (None when the model's shape is not at hand).

    Tensor parallelism splits the KV heads, so each worker's share of a token is 1/tp of the whole.
    """
    kv = served.runtime.kv_cache
    if kv is None or served.weights.source.startswith("hf:"):
        return None  # an hf: source would be downloaded just to read its shape
    dtype = "fp8" if kv.dtype == "fp8" else _compute_dtype(served)
    if dtype is None:
        return None
    from servegate.capacity.memory.weights import read_config
    from servegate.runtime.model.kv_memory import DTYPE_BYTES, kv_dims_from_config, num_kv_blocks
    from servegate.runtime.model.weights import resolve_weights_dir

    try:
        dims = kv_dims_from_config(read_config(resolve_weights_dir(served)))
    except Exception:  # a missing or odd config.json only skips this one comparison
        return None
    tp = served.runtime.parallelism.tensor_parallel_size
    per_token = max(1, dims.bytes_per_token(DTYPE_BYTES[dtype]) // tp)
    return num_kv_blocks(int(kv.memory_budget), kv.block_size, per_token)


def same_cache_dtype(declared: str, reported: str) -> bool:
    """Whether vLLM's cache_dtype label means the manifest's kv_cache.dtype (`fp8` covers fp8_e4m3 and kin)."""
    if declared == "fp8":
        return reported.startswith("fp8")
    return reported == "auto"


def truthy(label: str) -> bool | None:
    """A Python bool written as a Prometheus label ("True"/"False"), or None for anything else."""
    return {"true": True, "false": False}.get(label.strip().lower())
