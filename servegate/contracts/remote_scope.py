"""Which manifest fields servegate enforces in front of a remote engine, and which only describe the remote.

For `runtime.backend: endpoint`, servegate's contract layer (runtime/contract_layer.py) applies the
preprocess, postprocess and failure policy itself, so those mean the same as on the reference runtime.
Fields that say how the remote runs the model (its quantization, KV cache, scheduler) cannot be set or
read from outside: they are declared by whoever deployed the remote and are reported as declared, not
verified, unless a measurement on the remote covers them (`VERIFIED_ON_REMOTE`). For `runtime.backend:
llamacpp` servegate starts the server itself, so most of those are set on its command line (`SET_AT_LAUNCH_LLAMACPP`).
"""

from __future__ import annotations

from typing import Any

from servegate.contracts.manifest import ServedModel

ENFORCED_IN_FRONT: dict[str, str] = {
    "preprocess": "chat template, input limit and truncation, payload size, tenant identity: applied here, "
    "the remote gets token ids",
    "postprocess": "output cap, stop strings, output schema and byte limit, logprobs passthrough, response cache: "
    "applied here",
    "failure_policy": "deadline, bounded queue and overload answer, invalid output, fallback: applied here",
    "batching.max_batch_size": "requests in flight to the remote at once (the rest wait in the bounded queue)",
    "runtime.max_model_len": "prompt + output tokens allowed per request, checked here",
    "runtime.seed": "sent with every request that gives no seed",
    "runtime.kv_cache.cache_scope": "tenant scope sent as vLLM's cache_salt (a hash of the tenant); other "
    "engines: declared only",
}
"""Field (prefix) -> how servegate enforces it in front of the remote."""

DECLARED_BY_REMOTE: tuple[str, ...] = (
    "weights.sha256",
    "weights.format",
    "weights.dtype",
    "runtime.device",
    "runtime.dtype",
    "runtime.threads",
    "runtime.cpu_linear",
    "runtime.decode_attention",
    "runtime.quantization",
    "runtime.kv_cache.block_size",
    "runtime.kv_cache.memory_budget",
    "runtime.kv_cache.dtype",
    "runtime.kv_cache.prefix_caching",
    "batching.mode",
    "batching.max_wait_ms",
    "batching.max_num_batched_tokens",
    "batching.chunked_prefill",
    "postprocess.structured_output.whitespace",
)
"""Fields that only describe how the remote runs the model: servegate can neither set nor read them."""

VERIFIED_ON_REMOTE: dict[str, str] = {
    "runtime.engine": "the engine and version the remote reports (/version), recorded at gate time",
    "runtime.endpoint_model": "the model id the remote lists (/v1/models)",
    "postprocess.structured_output": "each request's constraint is sent as vLLM's structured_outputs, and "
    "every output it ended is checked here: JSON against its schema, choices, regexes (Python's re); "
    "grammars are not checked after; the JSON whitespace rule is the remote's own launch setting",
    "postprocess.tools": "the tools are rendered here by the chat template, a forced call's constraint is sent "
    "as vLLM's structured_outputs, and every call is read and checked here by the declared parser",
}
"""Fields a probe of the remote checks."""


SET_AT_LAUNCH_LLAMACPP: dict[str, str] = {
    "weights.gguf_file": "the file llama-server loads (--model)",
    "runtime.max_model_len": "each slot's context (--ctx-size is max_model_len x slots, --no-kv-unified)",
    "batching.max_batch_size": "--parallel slots, continuous batching (--cont-batching)",
    "batching.max_num_batched_tokens": "--batch-size (and --ubatch-size, at most runtime.llamacpp.ubatch_size)",
    "runtime.kv_cache.dtype": "--cache-type-k/-v: f32 for float32 compute, f16 for 16-bit",
    "runtime.kv_cache.prefix_caching": "cache_prompt on every request; false also sets --cache-ram 0",
    "runtime.threads": "--threads and --threads-batch",
    "runtime.seed": "--seed, and sent with every request",
    "preprocess.chat_template": "--jinja, --chat-template-file for a template file (the GGUF's own otherwise)",
}
"""For backend: llamacpp, the fields servegate sets on llama-server's command line when it starts it."""

VERIFIED_ON_LLAMACPP: dict[str, str] = {
    "runtime.engine": "llama.cpp and its build (GET /props build_info), recorded at start",
    "runtime.warmup": "/health, then each warm-up prompt's greedy output, before the server counts as ready",
    "preprocess.tokenizer": "the GGUF's vocabulary splits a probe text as the manifest's tokenizer does "
    "(POST /tokenize at start): servegate sends token ids",
    "postprocess.structured_output": "each request's JSON Schema is sent as llama-server's json_schema (choices as "
    "a GBNF grammar; regex and grammar constraints are refused), and every output is checked here",
    "runtime.kv_cache.cache_scope": "with prefix_caching false every request is sent cache_prompt: false, so no "
    "request starts from another's cached prompt (llama.cpp caches per slot, not per tenant); a tenant-scoped "
    "prefix cache is refused at validate. The caching gate's tenant timing audit measures it",
}
"""For backend: llamacpp, the fields checked on the server servegate started (`gate verify` reads /props and
/slots for the launch fields too)."""

DECLARED_LLAMACPP: tuple[str, ...] = (
    "weights.sha256",
    "runtime.device",
    "runtime.dtype",
    "runtime.cpu_linear",
    "runtime.decode_attention",
    "runtime.kv_cache.block_size",
    "runtime.kv_cache.memory_budget",
    "batching.chunked_prefill",
    "postprocess.structured_output.whitespace",
)
"""For backend: llamacpp, fields llama-server has no setting for: recorded, not set (export: RESIDUAL.md)."""


def _value(data: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def remote_scope(served: ServedModel) -> dict[str, Any] | None:
    """For an endpoint manifest: what is enforced here, verified on the remote, or only declared (None otherwise)."""
    if not served.runtime.remote:
        return None
    data = served.model_dump(mode="json")
    if served.runtime.backend == "llamacpp":
        declared = {path: _value(data, path) for path in DECLARED_LLAMACPP}
        front = {**ENFORCED_IN_FRONT}
        front.pop("runtime.kv_cache.cache_scope")
        return {
            "enforced_in_front": front,
            "set_at_launch": dict(SET_AT_LAUNCH_LLAMACPP),
            "verified_on_remote": dict(VERIFIED_ON_LLAMACPP),
            "declared_not_verified": {k: v for k, v in declared.items() if v is not None},
        }
    declared = {path: _value(data, path) for path in DECLARED_BY_REMOTE}
    return {
        "enforced_in_front": dict(ENFORCED_IN_FRONT),
        "verified_on_remote": dict(VERIFIED_ON_REMOTE),
        "declared_not_verified": {k: v for k, v in declared.items() if v is not None},
    }
