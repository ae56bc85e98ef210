"""Field-by-field diff of two manifests and the one table that maps a change to the gates it triggers.

The table is the contract between `gate diff` (which shows it) and `gate check --baseline A
--candidate B` (which runs exactly the gates it names, and reports why). It lives here, below the
gates, because the diff and an export's residuals (residual.py) name gates too; the gates register
with it, and plugin gates extend it through the registry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from servegate.contracts.manifest import SIX_ELEMENTS, ServedModel

GATE_WATCHES: dict[str, tuple[str, ...]] = {
    "contract": (
        "preprocess",
        "postprocess",
        "failure_policy",
        "runtime.warmup",
        "runtime.seed",
        "weights",
        # another backend, endpoint or engine version can answer errors and streams differently
        "runtime.backend",
        "runtime.endpoint_url",
        "runtime.endpoint_model",
        "runtime.engine",
    ),
    "quantization": (
        "runtime.quantization",
        "runtime.dtype",
        "weights.dtype",
        "runtime.kv_cache.dtype",
        "runtime.device",
        # a toolchain's quantized checkpoint (compressed-tensors, GGUF) or the parent it names
        "weights.format",
        "weights.gguf_file",
        "weights.derived_from",
    ),
    # another backend or engine version brings its own truncation, prefix cache and scheduler: the gates of what
    # it replaces run again, though no field of theirs changed
    "truncation": (
        "preprocess.max_input_tokens",
        "preprocess.truncation",
        "runtime.max_model_len",
        "postprocess.max_output_tokens",
        "runtime.backend",
        "runtime.engine",
    ),
    "caching": (
        "runtime.kv_cache.prefix_caching",
        "runtime.kv_cache.cache_scope",
        "postprocess.response_cache",
        "preprocess.tenant_from",
        "quality.cache_audit",
        "runtime.backend",
        "runtime.engine",
    ),
    # compiled kernels sum in another order, and only some batch sizes are compiled: quality and batch
    # invariance are re-checked, not only speed
    "batching": (
        "batching",
        "runtime.kv_cache",
        "runtime.compile",
        "runtime.compile_batch_sizes",
        "failure_policy.request_timeout_s",
        "runtime.backend",
        "runtime.engine",
    ),
    # outputs and streams at the declared concurrency: anything that changes how requests share the engine
    "load": (
        "batching",
        "runtime.kv_cache",
        "runtime.compile",
        "runtime.backend",
        "runtime.endpoint_url",
        "runtime.engine",
    ),
    "fallback": ("failure_policy.fallback",),
    "quality": (
        "weights",
        "preprocess.chat_template",
        "runtime.backend",
        "runtime.endpoint_url",
        "runtime.compile",
        "quality",
        "runtime.compile_batch_sizes",
        "runtime.endpoint_model",
        # another grammar engine, or another whitespace rule, changes which tokens a constrained answer may take
        "postprocess.structured_output",
        # another parser reads other calls out of the same text; other modes decode other outputs
        "postprocess.tools",
        # another engine or version behind the same model has changed quantized models' accuracy on its own
        "runtime.engine",
        # splitting layers across devices reorders their sums (all-reduce): outputs are re-checked, not only
        # speed; data_parallel_size (whole copies) changes only the throughput
        "runtime.parallelism.tensor_parallel_size",
        "runtime.parallelism.pipeline_parallel_size",
        "runtime.vllm",
        "runtime.llamacpp",
        # a lower output cap can end answers early while exact match holds: the length guard sees it
        "postprocess.max_output_tokens",
    ),
    "capacity": (
        "capacity",
        "batching",
        "runtime.kv_cache",
        "runtime.max_model_len",
        "runtime.threads",
        "runtime.cpu_linear",
        "runtime.decode_attention",
        "runtime.compile",
        "runtime.compile_batch_sizes",
        "runtime.device",
        "runtime.backend",
        "runtime.endpoint_url",
        "runtime.quantization",
        "postprocess.max_output_tokens",
        "runtime.engine",
        "runtime.parallelism",
    ),
}
"""The one trigger table: built-in gate -> the manifest field prefixes it watches, in the order `gate check`
runs them. A change at a path triggers every gate with a prefix equal to it or above it. The gates register
with these (`servegate.gates`), `gate check --list` shows them, and `gate diff` and `gate check` read
them back from the gate registry, where a plugin gate adds its own."""

Watches = Mapping[str, Sequence[str]]
"""Gate name -> watched field prefixes (GATE_WATCHES, or the gate registry's, which adds plugins)."""


def watches_path(prefixes: Iterable[str], path: str) -> bool:
    """Whether a change at dotted `path` is at or under one of `prefixes`."""
    return any(path == prefix or path.startswith(prefix + ".") for prefix in prefixes)


@dataclass(frozen=True)
class FieldChange:
    """One changed field: its dotted path, old and new value (None when absent) and the gates it triggers."""

    path: str
    old: Any
    new: Any
    gates: tuple[str, ...]

    @property
    def element(self) -> str:
        """Top-level section the field belongs to (one of the six elements, or quality/capacity/card/...)."""
        return self.path.split(".", 1)[0]


def gates_for_path(path: str, watches: Watches | None = None) -> tuple[str, ...]:
    """The gates a change at `path` triggers: every gate watching it or a field above it (GATE_WATCHES by default)."""
    table = GATE_WATCHES if watches is None else watches
    return tuple(gate for gate, prefixes in table.items() if watches_path(prefixes, path))


_MISSING = object()


def _walk(old: Any, new: Any, path: str, out: list[FieldChange], watches: Watches | None) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            _walk(old.get(key, _MISSING), new.get(key, _MISSING), f"{path}.{key}" if path else str(key), out, watches)
        return
    if old == new:
        return
    if isinstance(old, dict) or isinstance(new, dict):  # a section switched on or off: list its leaves
        for key in sorted(set(old if isinstance(old, dict) else {}) | set(new if isinstance(new, dict) else {})):
            o = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
            n = new.get(key, _MISSING) if isinstance(new, dict) else _MISSING
            _walk(o, n, f"{path}.{key}", out, watches)
        return
    gates = gates_for_path(path, watches)
    out.append(FieldChange(path, None if old is _MISSING else old, None if new is _MISSING else new, gates))


def diff_manifests(a: ServedModel, b: ServedModel, watches: Watches | None = None) -> list[FieldChange]:
    """Every field that differs between two manifests (cosmetic fields included, but they trigger no gate);
    each change names the gates `watches` (GATE_WATCHES by default) says it triggers."""
    out: list[FieldChange] = []
    _walk(a.model_dump(mode="json"), b.model_dump(mode="json"), "", out, watches)
    return out


def gates_for_changes(changes: list[FieldChange]) -> dict[str, list[str]]:
    """Gate name -> the changed fields that make it run (the 'why' shown in reports)."""
    reasons: dict[str, list[str]] = {}
    for change in changes:
        for gate in change.gates:
            reasons.setdefault(gate, []).append(change.path)
    return reasons


def diff_report(a: ServedModel, b: ServedModel, watches: Watches | None = None) -> dict[str, Any]:
    """The machine-readable diff: fingerprints, changes grouped by element, and the gates triggered."""
    changes = diff_manifests(a, b, watches)
    by_element: dict[str, list[dict[str, Any]]] = {}
    for change in changes:
        by_element.setdefault(change.element, []).append({**asdict(change), "gates": list(change.gates)})
    return {
        "baseline": {"name": a.name, "version": a.version, "fingerprint": a.fingerprint},
        "candidate": {"name": b.name, "version": b.version, "fingerprint": b.fingerprint},
        "same_behaviour": a.fingerprint == b.fingerprint,
        "changes": by_element,
        "behaviour_elements_changed": [e for e in SIX_ELEMENTS if e in by_element],
        "gates": gates_for_changes(changes),
    }
