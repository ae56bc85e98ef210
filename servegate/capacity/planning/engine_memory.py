"""The memory side of a plan for an engine servegate does not run itself (vLLM, an endpoint).

The memory model (memory/plan.py) adds the weights, the KV pool and one step's activations: for
servegate's own engine that is what its process holds beyond the interpreter, measured by `gate profile`.
An engine of its own (vLLM) holds much more: an API server, an engine core and workers, each with an
interpreter and torch. So for such an engine the plan's memory is the process group `gate profile` read
(bench/process_memory.py), its KV pool swapped for the planned one: the runtime term becomes everything the
group held beyond the weights and the pool it ran with. An engine whose processes were never read (an
endpoint, whose processes are elsewhere, or a profile made before this was measured) gets no memory
verdict at all: the weights-plus-pool sum is printed as a partial sum, and the memory target is not
said to be met from it.
"""

from __future__ import annotations

from dataclasses import replace

from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.memory.plan import MemoryPlan
from servegate.contracts.manifest import ServedModel


def engine_memory(memory: MemoryPlan, served: ServedModel, model: LatencyModel) -> MemoryPlan:
    """`memory` for the manifest's engine: unchanged for servegate's own engine; from the measured process group
    for an engine servegate started and profiled; marked not modelled for any other (module notes)."""
    if not served.runtime.remote:
        return memory
    box = model.fit.black_box
    group = box.process_memory if box is not None else None
    if group is None:
        why = (
            f"the {served.runtime.backend} engine's processes run elsewhere: servegate cannot read their memory"
            if served.runtime.external
            else f"the profile did not read the {served.runtime.backend} engine's processes: `gate profile` again"
        )
        return replace(memory, modelled=False, not_modelled_reason=why)
    held = max(0, group.total_bytes - group.kv_pool_bytes - memory.weights_bytes)
    source = f"measured by `gate profile`: {group.describe()}, less the weights and its KV pool"
    # the group already holds a fallback engine (in servegate's server) and any compiled copy: not added again
    plan = replace(
        memory, runtime_overhead_bytes=held, runtime_overhead_source=source, fallback_bytes=0, compiled_weights_bytes=0
    )
    return plan.with_kv_pool(memory.kv_pool_bytes)
