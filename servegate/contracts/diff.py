"""Field-by-field diff of two manifests and the one table that maps a change to the gates it triggers.

The table is the contract between `gate diff` (which shows it) and `gate check --baseline A
--candidate B` (which runs exactly the gates it names, and reports why).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from servegate.contracts.manifest import SIX_ELEMENTS, ServedModel

# Longest matching prefix wins. A prefix maps to the gates a change under it can affect.
GATE_TRIGGERS: dict[str, tuple[str, ...]] = {
    "weights": ("quality", "contract"),
    "weights.dtype": ("quantization",),
    "preprocess": ("contract",),
    "preprocess.chat_template": ("quality", "contract"),
    "preprocess.max_input_tokens": ("truncation", "contract"),
    "preprocess.truncation": ("truncation", "contract"),
    "preprocess.tenant_from": ("caching", "contract"),
    "runtime": ("quality",),
    "runtime.dtype": ("quantization",),
    "runtime.quantization": ("quantization",),
    "runtime.kv_cache": ("batching", "capacity"),
    "runtime.kv_cache.dtype": ("quantization",),
    "runtime.kv_cache.prefix_caching": ("caching",),
    "runtime.kv_cache.cache_scope": ("caching",),
    "runtime.max_model_len": ("truncation", "capacity"),
    "runtime.threads": ("capacity",),
    "runtime.cpu_linear": ("capacity",),
    # compiled kernels sum in another order, and only some batch sizes are compiled: quality and batch
    # invariance are re-checked, not only speed
    "runtime.compile": ("quality", "batching", "capacity"),
    "runtime.compile_batch_sizes": ("quality", "batching", "capacity"),
    "runtime.device": ("quantization", "capacity"),
    # splitting layers across devices reorders their sums (all-reduce): outputs are re-checked, not only speed
    "runtime.parallelism": ("quality", "capacity"),
    "runtime.parallelism.data_parallel_size": ("capacity",),  # whole copies: only the throughput changes
    "runtime.backend": ("quality", "contract", "capacity"),
    "runtime.endpoint_url": ("quality", "contract", "capacity"),
    "runtime.endpoint_model": ("quality", "contract"),
    # another engine or version behind the same model has changed quantized models' accuracy on its own
    "runtime.engine": ("quality", "contract", "capacity"),
    "runtime.warmup": ("contract",),
    "runtime.seed": ("contract",),
    "batching": ("batching", "capacity"),
    "postprocess": ("contract",),
    "postprocess.response_cache": ("caching",),
    # a lower output cap can end answers early while exact match holds: the quality gate's length guard sees it
    "postprocess.max_output_tokens": ("quality", "contract", "capacity"),
    "failure_policy": ("contract",),
    "failure_policy.fallback": ("fallback",),
    "failure_policy.request_timeout_s": ("contract", "batching"),
    "quality": ("quality",),
    "quality.cache_audit": ("caching",),
    "capacity": ("capacity",),
}
"""Manifest field prefix -> the gates a change there must run (the longest prefix wins)."""


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


def gates_for_path(path: str) -> tuple[str, ...]:
    """The gates a change at `path` triggers, by the longest matching prefix of GATE_TRIGGERS."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        key = ".".join(parts[:end])
        if key in GATE_TRIGGERS:
            return GATE_TRIGGERS[key]
    return ()


_MISSING = object()


def _walk(old: Any, new: Any, path: str, out: list[FieldChange]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            _walk(old.get(key, _MISSING), new.get(key, _MISSING), f"{path}.{key}" if path else str(key), out)
        return
    if old == new:
        return
    if isinstance(old, dict) or isinstance(new, dict):  # a section switched on or off: list its leaves
        for key in sorted(set(old if isinstance(old, dict) else {}) | set(new if isinstance(new, dict) else {})):
            o = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
            n = new.get(key, _MISSING) if isinstance(new, dict) else _MISSING
            _walk(o, n, f"{path}.{key}", out)
        return
    out.append(
        FieldChange(path, None if old is _MISSING else old, None if new is _MISSING else new, gates_for_path(path))
    )


def diff_manifests(a: ServedModel, b: ServedModel) -> list[FieldChange]:
    """Every field that differs between two manifests (cosmetic fields included, but they trigger no gate)."""
    out: list[FieldChange] = []
    _walk(a.model_dump(mode="json"), b.model_dump(mode="json"), "", out)
    return out


def gates_for_changes(changes: list[FieldChange]) -> dict[str, list[str]]:
    """Gate name -> the changed fields that make it run (the 'why' shown in reports)."""
    reasons: dict[str, list[str]] = {}
    for change in changes:
        for gate in change.gates:
            reasons.setdefault(gate, []).append(change.path)
    return reasons


def diff_report(a: ServedModel, b: ServedModel) -> dict[str, Any]:
    """The machine-readable diff: fingerprints, changes grouped by element, and the gates triggered."""
    changes = diff_manifests(a, b)
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
