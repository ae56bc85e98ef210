"""Predicting one batching policy: simulate a manifest's scheduler under a workload with a fitted latency model.

Shared by the planner (which predicts many candidate policies) and `gate plan --verify` (which then
measures the chosen one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servegate.capacity.bench.workload import make_requests
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.provenance import hardware_id, profile_path
from servegate.capacity.latency.simulate import SimResult, SimSetup, simulate
from servegate.capacity.memory.plan import compute_dtype, manifest_config
from servegate.contracts.capacity_section import Workload
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.sections import Batching
from servegate.runtime.model.kv_memory import kv_dims_from_config


def profile_key(served: ServedModel) -> str:
    """The fingerprint a profile is kept under: the manifest with its batching section at defaults.

    Step times depend on the weights, runtime, preprocess and postprocess, not on the batching policy
    that the planner varies, so one profile serves every candidate policy.
    """
    data = served.model_dump(mode="python")
    kv = data["runtime"].get("kv_cache")
    # prefix caching (allowed with continuous batching only) stays in the key: a miss costs time on every step
    caching = kv is not None and kv.get("prefix_caching")
    data["batching"] = Batching(mode="continuous" if caching else "none").model_dump(mode="python")
    if kv is not None:  # pool size changes admission, not step times
        data["runtime"]["kv_cache"] = {**kv, "memory_budget": 2**20}
    return ServedModel.model_validate(data).fingerprint


PROFILE_TAKES = "minutes: 623 s for the quickstart on a busy 2-core VM, longer for a larger model"
"""How long profiling runs, as measured: `gate plan examples/quickstart/manifest.yaml --profile` on 2026-12-01
20:59 UTC, 2 shared cores at load average 8-11 (benchmarks/README.md)."""


def load_profile(served: ServedModel) -> LatencyModel:
    """The saved latency model of this manifest on this machine, or an error saying how to make one."""
    path = profile_path(profile_key(served), hardware_id())
    if not path.is_file():
        raise ServegateError(
            f"no latency profile of {served.name} on this machine ({path}): run `gate profile` on the manifest "
            f"first, or `gate plan --profile` to profile and then plan (profiling takes {PROFILE_TAKES})"
        )
    return LatencyModel.load(path)


def sim_setup(served: ServedModel) -> SimSetup:
    """The simulated engine for a manifest, with the KV pool the runtime would allocate."""
    from servegate.runtime.scheduling.kv_blocks import pool_size

    dims = kv_dims_from_config(manifest_config(served))
    kv = served.runtime.kv_cache
    dtype = "fp8" if kv is not None and kv.dtype == "fp8" else compute_dtype(served)
    num_blocks, block_size = pool_size(served, dims, dtype)
    return SimSetup.from_manifest(served, num_blocks, block_size)


@dataclass
class Prediction:
    """Predicted behaviour of one policy under one workload."""

    summary: dict[str, Any]
    """Bench-shaped figures (ttft_ms, tpot_ms, itl_ms, e2el_ms, throughput, ...) plus queue and KV figures."""
    result: SimResult


def predict(
    setup: SimSetup, model: LatencyModel, workload: Workload, num_requests: int | None = None, seed: int = 0
) -> Prediction:
    """Simulate `workload` (its own arrival process) on `setup`."""
    specs = make_requests(workload, seed, num_requests=num_requests)
    concurrency = workload.concurrency if workload.arrival == "closed" else None
    result = simulate(setup, model, specs, concurrency=concurrency, seed=seed)
    return Prediction(result.summary(), result)


def saturation_throughput(
    setup: SimSetup, model: LatencyModel, workload: Workload, num_requests: int = 60, seed: int = 0
) -> float:
    """Requests/s the policy sustains when requests are always waiting (closed loop at twice its batch size)."""
    concurrency = max(4, 2 * setup.max_batch_size)
    closed = workload.model_copy(update={"arrival": "closed", "concurrency": concurrency, "rate_rps": None})
    specs = make_requests(closed, seed, num_requests=max(num_requests, 3 * concurrency))
    timeless = SimSetup(**{**setup.__dict__, "timeout_s": float("inf"), "max_queue": 1_000_000})
    result = simulate(timeless, model, specs, concurrency=concurrency, seed=seed, drift=False)
    return float(result.summary()["throughput"]["requests_per_s"])
