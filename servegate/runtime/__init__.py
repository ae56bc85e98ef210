"""servegate.runtime: `build(served)` turns a manifest into an Engine (reference in process, or an endpoint).

Where each of the six elements lives:

    model/weights.py, model/quantization.py   weights: resolve, verify, load, quantize
    preprocess.py                              preprocess: chat template, tokens, limits, truncation
    types.py                                   the requests, events and results every part below imports
    engine/, model/                            runtime: the engine loop and the model it runs
    scheduling/                                batching: one scheduler per batching mode
    postprocess.py                             postprocess: detokenizing, stops, output schema
    failure_policy/                            failure policy: overload, deadlines, fallback

contract_layer.py applies the manifest's contract the same way around every engine core (response_cache.py
beside it); remote/ holds the cores that are not servegate's own (an OpenAI-compatible endpoint, vLLM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servegate.contracts.manifest import ServedModel
    from servegate.runtime.engine.interface import Engine
    from servegate.runtime.engine.step_trace import StepTrace


def build(served: ServedModel, *, fallback: bool = True, step_trace: StepTrace | None = None) -> Engine:
    """The engine a manifest declares, not yet started (call `await engine.start()` or `start_sync()`).

    runtime.backend `reference` gives servegate's in-process engine; `endpoint` an OpenAI-compatible server
    wrapped in the same contract (contract_layer.py); `vllm` a vLLM server servegate starts from the
    manifest, wrapped the same way, and `llamacpp` a llama-server on the manifest's GGUF. With fallback=True and
    a declared failure_policy.fallback, the fallback manifest's engine is built too and serves the requests the
    declared triggers route to it (on CPU, with at most the cores the primary leaves:
    failure_policy/shared_cores.py). `step_trace` records every step of a reference engine (the others
    compute their steps elsewhere and ignore it).
    """
    from servegate.contracts.loading import load_fallback

    backup = load_fallback(served) if fallback else None
    if backup is not None and not served.runtime.remote:
        from servegate.runtime.failure_policy.shared_cores import beside_primary

        backup = beside_primary(served, backup)
    backup_engine = build(backup, fallback=False) if backup is not None else None
    if served.runtime.backend == "endpoint":
        from servegate.runtime.remote.endpoint import EndpointEngine

        primary: Engine = EndpointEngine(served, fallback=backup_engine)
        return primary
    if served.runtime.backend == "vllm":
        from servegate.runtime.remote.vllm_backend import VllmEngine

        return VllmEngine(served, fallback=backup_engine)
    if served.runtime.backend == "llamacpp":
        from servegate.runtime.remote.llamacpp_backend import LlamaCppEngine

        return LlamaCppEngine(served, fallback=backup_engine)
    from servegate.runtime.engine.reference import ReferenceEngine

    return ReferenceEngine(served, fallback=backup_engine, step_trace=step_trace)


__all__ = ["build"]
