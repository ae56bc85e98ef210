"""After the search: the engine's policies for an endpoint, and sizing the recommended policy per replica.

An engine servegate does not run (`runtime.backend: endpoint` or `vllm`) batches continuously whatever the
manifest's batching mode says, so its candidates are the two limits it takes: max_batch_size (vLLM's
`--max-num-seqs`) and max_num_batched_tokens. Every plan then says how many requests/s the recommended
policy carries on one replica under the latency targets (rate_limit.py) and, for a declared total rate or
an arrival trace's peak, how many replicas that takes (replicas.py).
"""

from __future__ import annotations

from typing import Any

from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.prediction import sim_setup
from servegate.capacity.planning.rate_limit import RateLimit, max_rate
from servegate.capacity.planning.replicas import ReplicaPlan, replicas_for
from servegate.contracts.capacity_section import Targets, Workload
from servegate.contracts.manifest import ServedModel

ENGINE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""max_batch_size values tried for an engine (up to 4x the declared one)."""


def engine_policies(served: ServedModel) -> list[dict[str, Any]]:
    """Continuous batching at every max_batch_size x max_num_batched_tokens pair worth trying."""
    max_in = served.preprocess.max_input_tokens
    declared = served.batching
    batches = [b for b in ENGINE_BATCHES if b <= max(2, 4 * declared.max_batch_size)]
    batches = sorted({*batches, declared.max_batch_size})
    budgets = sorted({max_in, 2 * max_in, 4 * max_in, 8 * max_in, declared.max_num_batched_tokens})
    if not declared.chunked_prefill:  # vLLM refuses to start with a budget below max_model_len without chunking
        budgets = [t for t in budgets if t >= served.runtime.max_model_len] or [served.runtime.max_model_len]
    return [
        {
            "mode": "continuous",
            "max_batch_size": b,
            "max_wait_ms": 0.0,
            "max_num_batched_tokens": tokens,
            "chunked_prefill": declared.chunked_prefill,
        }
        for b in batches
        for tokens in budgets
    ]


def quick_rate(
    served: ServedModel, model: LatencyModel, workload: Workload, targets: Targets | None, num_requests: int = 150
) -> float:
    """The central max rate under the targets with one jitter seed, to 1/32 of the capacity (for ranking)."""
    setup = sim_setup(served)
    limit = max_rate(setup, model, workload, targets, num_requests=num_requests, seeds=1, interval=False, bisections=5)
    return limit.rate_rps


def size(
    served: ServedModel,
    model: LatencyModel,
    workload: Workload,
    total: tuple[float, str] | None,
    num_requests: int = 200,
) -> tuple[RateLimit, ReplicaPlan | None]:
    """The recommended policy's rate limit and the replicas for `total` (rate, where it came from); no replica
    count when the targets leave one replica nothing to carry (the limit's detail says why)."""
    limit = max_rate(sim_setup(served), model, workload, served.capacity.targets, num_requests=num_requests)
    if limit.rate_rps <= 0 or total is None:
        return limit, None
    return limit, replicas_for(total[0], limit.rate_rps, total[1])
