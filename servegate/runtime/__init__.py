"""servegate.runtime: `build(served)` turns a manifest into an Engine (reference in process, or an endpoint)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servegate.contracts.manifest import ServedModel
    from servegate.runtime.api import Engine


def build(served: ServedModel, *, fallback: bool = True) -> Engine:
    """The engine a manifest declares, not yet started (call `await engine.start()` or `start_sync()`).

    runtime.backend `reference` gives servegate's in-process engine; `endpoint` an OpenAI-compatible server
    wrapped in the same contract (runtime/contract_layer.py); `vllm` a vLLM server servegate starts from the
    manifest, wrapped the same way. With fallback=True and a declared
    failure_policy.fallback, the fallback manifest's engine is built too and serves the requests the
    declared triggers route to it (on CPU, with at most the cores the primary leaves: runtime/shared_cores.py).
    """
    from servegate.contracts.loading import load_fallback

    backup = load_fallback(served) if fallback else None
    if backup is not None and served.runtime.backend == "reference":
        from servegate.runtime.shared_cores import beside_primary

        backup = beside_primary(served, backup)
    backup_engine = build(backup, fallback=False) if backup is not None else None
    if served.runtime.backend == "endpoint":
        from servegate.runtime.endpoint import EndpointEngine

        primary: Engine = EndpointEngine(served, fallback=backup_engine)
        return primary
    if served.runtime.backend == "vllm":
        from servegate.runtime.vllm_backend import VllmEngine

        return VllmEngine(served, fallback=backup_engine)
    from servegate.runtime.engine import ReferenceEngine

    return ReferenceEngine(served, fallback=backup_engine)


__all__ = ["build"]
