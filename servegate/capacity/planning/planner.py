"""`gate plan`: from request shape, load, latency targets and memory budget to a batching policy.

The search. Candidate policies are the batching modes with a grid of their numbers (max_batch_size,
max_wait_ms, max_num_batched_tokens, chunked prefill); each is checked against the manifest's own
rules, given the KV pool the runtime would allocate, and simulated under the workload with the
latency model fitted on this machine. A candidate is feasible when every declared target holds.
The KV pool (its blocks) is sized to the memory target when one is declared, and runtime.max_model_len
to the longest request the contract accepts.

The regime. If one request at a time could carry the load (offered load x single-request service
time well below 1), single-request latency decides: the deployment is latency-bound and the plan
picks the feasible policy with the lowest predicted latency. Otherwise batch efficiency decides: it
is throughput-bound and the plan picks the feasible policy that sustains the most requests/s.

When nothing is feasible, the plan keeps the candidate closest to feasible and says, per missed target,
the prediction, the target and by how much it is missed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.prediction import Prediction, predict, saturation_throughput, sim_setup
from servegate.capacity.memory.plan import MemoryPlan
from servegate.capacity.planning.rate_limit import RateLimit
from servegate.capacity.planning.replicas import ReplicaPlan
from servegate.capacity.planning.sizing import engine_policies, quick_rate, size
from servegate.capacity.planning.target_checks import TargetCheck, check_targets
from servegate.contracts.capacity_section import Workload
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.units import format_bytes

THROUGHPUT_BOUND_LOAD = 0.7
"""Offered load (x single-request service time) above which one-at-a-time serving queues too much."""


@dataclass
class Candidate:
    """One batching policy with its prediction."""

    batching: dict[str, Any]
    served: ServedModel
    prediction: Prediction
    checks: list[TargetCheck]
    num_blocks: int
    """KV blocks in the pool the runtime would allocate for this policy."""
    capacity_rps: float | None = None
    """Requests/s this policy sustains with requests always waiting."""
    max_rate_rps: float | None = None
    """Requests/s it carries under the latency targets (engines: what ranks their feasible policies)."""

    @property
    def feasible(self) -> bool:
        """Every target met."""
        return all(c.met for c in self.checks)

    @property
    def worst_ratio(self) -> float:
        """The largest predicted/target ratio (how far from feasible)."""
        return max((c.ratio for c in self.checks), default=0.0)


@dataclass
class Plan:
    """The planner's answer."""

    regime: str
    regime_reason: str
    recommended: Candidate
    feasible: bool
    binding: dict[str, Any]
    memory: MemoryPlan
    single_request_ms: float
    candidates: list[Candidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    """When infeasible: per missed target, the miss and what would change it."""
    rate_limit: RateLimit | None = None
    """What the recommended policy carries on one replica under the targets, and what binds."""
    replicas: ReplicaPlan | None = None
    """Replicas for the declared total rate (or an arrival trace's peak), when one is given."""


def candidate_policies(served: ServedModel) -> list[dict[str, Any]]:
    """The batching sections to try (before the manifest's rules prune them)."""
    max_in = served.preprocess.max_input_tokens
    batches = [b for b in (2, 4, 8, 16, 32, 64) if b <= max(2, served.batching.max_batch_size * 4)]
    out: list[dict[str, Any]] = [{"mode": "none", "max_batch_size": 1}]
    for b in batches:
        for wait in (2.0, 10.0):
            out.append({"mode": "dynamic", "max_batch_size": b, "max_wait_ms": wait})
        out.append({"mode": "static", "max_batch_size": b, "max_wait_ms": 10.0})
    if served.runtime.kv_cache is not None:
        token_budgets = sorted({max_in, 2 * max_in, 4 * max_in, served.batching.max_num_batched_tokens})
        for b in batches:
            for tokens in token_budgets:
                out.append({"mode": "continuous", "max_batch_size": b, "max_num_batched_tokens": tokens})
            out.append(
                {"mode": "continuous", "max_batch_size": b, "max_num_batched_tokens": max_in, "chunked_prefill": True}
            )
    return out


def _regime(served: ServedModel, workload: Workload, model: LatencyModel) -> tuple[str, str, float]:
    """Latency- or throughput-bound, why, and the single-request service time in seconds."""
    p, o = workload.input_tokens.mean, workload.output_tokens.mean
    service = model.overheads.request_s + model.prefill_time(p) + (o - 1) * model.decode_time(1, p + o // 2)
    service += model.overheads.finish_s
    ms = 1000 * service
    if workload.arrival == "closed":
        # a closed loop of C keeps C - 1 requests waiting behind the one a batch of one serves
        load = float((workload.concurrency or 1) - 1)
        what = f"{workload.concurrency} requests kept in flight ({load:.0f} waiting behind one served alone)"
    else:
        load = (workload.rate_rps or 0.0) * service
        what = f"{workload.rate_rps:g} requests/s offered x {ms:.1f} ms per request served alone"
    targets = served.capacity.targets
    floor = targets.throughput if targets else None
    if floor is not None:
        floor_rps = floor.value if floor.unit == "requests/s" else floor.value / max(o, 1)
        if floor_rps * service > load:
            load = floor_rps * service
            what = f"a throughput floor of {floor.value:g} {floor.unit} x {ms:.1f} ms per request served alone"
    if load >= THROUGHPUT_BOUND_LOAD:
        why = "one request at a time cannot keep up, batch efficiency decides"
        return "throughput-bound", f"{what} = load {load:.2f} >= {THROUGHPUT_BOUND_LOAD}: {why}", service
    why = "requests rarely overlap, single-request latency decides"
    return "latency-bound", f"{what} = load {load:.2f} < {THROUGHPUT_BOUND_LOAD}: {why}", service


def _binding(best: Candidate, memory: MemoryPlan) -> dict[str, Any]:
    """The constraint closest to limiting the recommended policy."""
    s = best.prediction.summary
    run_max = s["running"]["max"]
    if s["preemptions"] > 0 or (s["kv_blocks_used"]["max"] >= 0.95 * best.num_blocks):
        return {"name": "kv_memory", "detail": f"the KV pool ran full ({s['preemptions']} preemptions predicted)"}
    # the KV pool is sized to fill a memory target, so memory binds only when it is missed
    ranked = [c for c in best.checks if c.name != "memory" or not c.met]
    if ranked:
        tight = max(ranked, key=lambda c: c.ratio)
        return {"name": tight.name, "detail": tight.sentence(), "ratio": tight.ratio}
    if run_max >= best.batching.get("max_batch_size", 1) and s["queue_length"]["max"] > 0:
        return {"name": "max_batch_size", "detail": "batches ran full while requests queued"}
    return {"name": "none", "detail": "no target declared and nothing saturated"}


def _fit_max_model_len(served: ServedModel, notes: list[str]) -> ServedModel:
    """runtime.max_model_len at the smallest value that admits every request the contract accepts.

    Paged KV memory is taken per token, so a longer max_model_len never buys throughput; it only lets a
    sequence grow beyond what preprocess and postprocess allow, and (without runtime.kv_cache) sizes each
    request-level slot of the pool. The contract needs max_input_tokens + max_output_tokens.
    """
    need = served.preprocess.max_input_tokens + served.postprocess.max_output_tokens
    declared = served.runtime.max_model_len
    if need >= declared:
        return served
    try:
        fitted = served.with_changes(runtime={**served.runtime.model_dump(mode="python"), "max_model_len": need})
    except ValidationError:
        return served
    notes.append(
        f"runtime.max_model_len {need} tokens (max_input_tokens + max_output_tokens; declared {declared}): "
        "no request the contract accepts is longer, and paged KV memory is taken per token"
    )
    return fitted


def _size_kv_pool(served: ServedModel, memory: MemoryPlan, notes: list[str]) -> tuple[ServedModel, MemoryPlan]:
    """With a memory target, give the KV pool everything the weights and runtime leave (the runtime's block count)."""
    targets, kv = served.capacity.targets, served.runtime.kv_cache
    if targets is None or targets.memory is None or kv is None or not memory.modelled:
        return served, memory  # not modelled: what is left after a partial sum is no pool size
    pool = memory.pool_within(targets.memory)
    if pool <= 0 or pool == kv.memory_budget:
        return served, memory
    runtime = served.runtime.model_dump(mode="python")
    runtime["kv_cache"] = {**runtime["kv_cache"], "memory_budget": pool}
    try:
        sized = served.with_changes(runtime=runtime)
    except ValidationError:
        return served, memory
    memory = memory.with_kv_pool(pool)
    notes.append(
        f"KV pool sized to the memory target: runtime.kv_cache.memory_budget {pool:,} bytes "
        f"({memory.num_kv_blocks:,} blocks; declared {kv.memory_budget:,} bytes)"
    )
    return sized, memory


def plan(
    served: ServedModel,
    workload: Workload,
    model: LatencyModel,
    memory: MemoryPlan,
    *,
    num_requests: int = 300,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    total: tuple[float, str] | None = None,
) -> Plan:
    """Search the batching policies and recommend one (see the module notes); `total` is the rate the whole
    deployment must carry and where it came from (replicas are sized for it)."""
    targets = served.capacity.targets
    regime, reason, service = _regime(served, workload, model)
    engine = served.runtime.remote
    if engine:
        regime, reason = "throughput-bound", "an engine is planned for the most requests/s one replica carries"
    policies = engine_policies(served) if engine else candidate_policies(served)
    notes = _context_notes(served, model, memory, engine)
    served = _fit_max_model_len(served, notes)
    served, memory = _size_kv_pool(served, memory, notes)
    n = min(num_requests, workload.num_requests)
    needs_capacity = regime == "throughput-bound" or (targets is not None and targets.throughput is not None)
    search = _Search(served, workload, model, memory, n, seed, engine, needs_capacity)
    candidates = search.candidates(policies, progress)
    feasible = [c for c in candidates if c.feasible]
    best = _recommend(candidates, feasible, regime, engine)
    if best.capacity_rps is None:
        best.capacity_rps = saturation_throughput(sim_setup(best.served), model, workload, seed=seed)
    ranked = sorted(candidates, key=lambda c: (c is not best, not c.feasible, c.worst_ratio))
    why = [] if feasible else explain_misses(best, model, workload, memory)
    rate_limit, replicas = size(best.served, model, workload, total, min(n, 200))
    if best.max_rate_rps is None:
        best.max_rate_rps = rate_limit.rate_rps
    return Plan(
        rate_limit=rate_limit,
        replicas=replicas,
        why=why,
        regime=regime,
        regime_reason=reason,
        recommended=best,
        feasible=bool(feasible),
        binding=_binding(best, memory),
        memory=memory,
        single_request_ms=1000 * service,
        candidates=ranked,
        notes=notes,
    )


def _context_notes(served: ServedModel, model: LatencyModel, memory: MemoryPlan, engine: bool) -> list[str]:
    """What the reader of a plan should know before its figures: what is searched, a changed machine, extra memory."""
    notes: list[str] = []
    if engine:
        notes.append(
            f"the {served.runtime.backend} engine's scheduler is modelled as continuous batching; its two limits "
            "(max_batch_size, max_num_batched_tokens) are searched"
        )
    elif served.runtime.kv_cache is None:
        notes.append("continuous batching not searched: the manifest declares no runtime.kv_cache")
    then, now = model.provenance.load_average_1m, os.getloadavg()[0]
    if then is not None and abs(now - then) > max(1.0, 0.5 * then):
        notes.append(
            f"the machine's load average is {now:.1f} now and was {then:.1f} when profiled: other work shifts "
            "step times, so predictions hold for the conditions of the profile (re-run gate profile)"
        )
    if memory.fallback_bytes:
        notes.append(
            f"the fallback manifest's engine runs in the same server: its {format_bytes(memory.fallback_bytes)} "
            "(weights, runtime overhead, KV pool) count in the memory total"
        )
    if memory.compiled_weights_bytes:
        notes.append(
            f"runtime.compile: {served.runtime.compile} holds copies of the linear weights in each compiled graph "
            "(and, where "
            "cpu_linear routes the eager steps through oneDNN, their packed copy): "
            f"{format_bytes(memory.compiled_weights_bytes)} count in the memory total"
        )
    return notes


def _slots_fit(served: ServedModel, memory: MemoryPlan) -> bool:
    """Whether llama.cpp could start with these slots: it allocates max_model_len tokens of KV for every slot up
    front (runtime/remote/llamacpp_args.py), so slots x max_model_len must fit the KV pool. True for any other
    engine, whose pool is paged."""
    from servegate.runtime.remote.llamacpp_args import context_tokens

    kv = served.runtime.kv_cache
    if served.runtime.backend != "llamacpp" or kv is None:
        return True
    return context_tokens(served) * memory.kv_bytes_per_token <= int(kv.memory_budget)


@dataclass(frozen=True)
class _Search:
    """What every candidate policy is predicted under: the fitted manifest, the workload, model and memory plan."""

    served: ServedModel
    workload: Workload
    model: LatencyModel
    memory: MemoryPlan
    num_requests: int
    """Requests simulated per candidate."""
    seed: int
    engine: bool
    """Whether an engine servegate does not run is planned (feasible candidates get their rate under the targets)."""
    needs_capacity: bool
    """Whether candidates are ranked by what they sustain (throughput-bound, or a throughput floor declared)."""

    def candidates(
        self, policies: list[dict[str, Any]], progress: Callable[[int, int], None] | None
    ) -> list[Candidate]:
        """Every policy the manifest's rules allow, predicted; `progress(done, all)` is told before each one."""
        candidates: list[Candidate] = []
        for i, batching in enumerate(policies):
            if progress:
                progress(i, len(policies))
            candidate = self.candidate(batching)
            if candidate is not None:
                candidates.append(candidate)
        if progress:
            progress(len(policies), len(policies))
        if not candidates:
            raise ServegateError("no batching policy fits this manifest's rules and KV pool: check runtime.kv_cache")
        return candidates

    def candidate(self, batching: dict[str, Any]) -> Candidate | None:
        """One policy predicted and checked against the targets; None when the manifest's rules rule it out."""
        targets, model, workload, n = self.served.capacity.targets, self.model, self.workload, self.num_requests
        try:
            candidate_served = self.served.with_changes(batching=batching)
            setup = sim_setup(candidate_served)
        except (ValidationError, ServegateError, ValueError):
            return None  # the manifest's own rules (or its KV pool) rule this policy out
        if not _slots_fit(candidate_served, self.memory):
            return None
        prediction = predict(setup, model, workload, n, self.seed)
        checks = check_targets(targets, prediction.summary, self.memory.judged_bytes)
        cand = Candidate(batching, candidate_served, prediction, checks, setup.num_blocks)
        latency_ok = all(c.met for c in checks if c.unit == "ms")
        if self.needs_capacity and latency_ok:  # only a policy that can be chosen is ranked by what it sustains
            cand.capacity_rps = saturation_throughput(setup, model, workload, seed=self.seed)
        # an engine's memory (its processes and KV pool) is the same under every policy: a missed memory target
        # makes none feasible, and must not leave the policy to chance, so the rest still ranks them
        if self.engine and all(c.met for c in checks if c.name != "memory"):
            cand.max_rate_rps = quick_rate(candidate_served, model, workload, targets, min(n, 150))
        return cand


def _latency_score(c: Candidate) -> float:
    """The worst latency target ratio, or without a latency target the predicted p99 end-to-end ms."""
    keyed = [ch.ratio for ch in c.checks if ch.unit == "ms"]
    return max(keyed) if keyed else float(c.prediction.summary["e2el_ms"]["p99"])


def _recommend(candidates: list[Candidate], feasible: list[Candidate], regime: str, engine: bool) -> Candidate:
    """The feasible policy the regime prefers (most sustained or carried, else lowest latency), else the closest."""
    rated = [c for c in candidates if c.max_rate_rps is not None]
    if not feasible and engine and rated:  # only the memory target missed, by every policy alike
        return max(rated, key=lambda c: (c.max_rate_rps or 0.0, -_latency_score(c)))
    if not feasible:
        return min(candidates, key=lambda c: (c.worst_ratio, _latency_score(c)))
    if engine:
        return max(feasible, key=lambda c: (c.max_rate_rps or 0.0, -_latency_score(c)))
    if regime == "throughput-bound":
        return max(feasible, key=lambda c: (c.capacity_rps or 0.0, -_latency_score(c)))
    return min(feasible, key=lambda c: (round(_latency_score(c), 3), c.batching.get("max_batch_size", 1)))


def alone_ms(model: LatencyModel, workload: Workload) -> dict[str, float]:
    """Predicted TTFT, TPOT and end-to-end latency of a mean-shaped request served alone, in ms."""
    p, o = workload.input_tokens.mean, workload.output_tokens.mean
    ttft = model.overheads.request_s + model.prefill_time(p)
    tpot = model.decode_time(1, p + o // 2)
    return {
        "ttft_ms": 1000 * ttft,
        "tpot_ms": 1000 * tpot,
        "e2e_ms": 1000 * (ttft + (o - 1) * tpot + model.overheads.finish_s),
    }


def explain_misses(best: Candidate, model: LatencyModel, workload: Workload, memory: MemoryPlan) -> list[str]:
    """Why the closest policy still misses: each missed target, by how much, and what would change it."""
    alone = alone_ms(model, workload)
    lines: list[str] = []
    for check in best.checks:
        if check.met:
            continue
        line = check.sentence()
        if check.unit == "ms":
            floor = alone[check.name.split(".")[0]]
            if floor > check.target:
                line += (
                    f"; even served alone a request takes {floor:.4g} ms here, so no batching policy can meet it: "
                    "use faster hardware, a smaller or quantized model, or shorter prompts/outputs"
                )
            else:
                line += (
                    f"; served alone it would take {floor:.4g} ms, the rest is queueing at this load: "
                    "add replicas, lower the load, or relax the target"
                )
        elif check.name.startswith("throughput"):
            cap = best.capacity_rps or 0.0
            line += f"; the best policy sustains {cap:.4g} requests/s on one replica"
            if cap > 0 and check.unit == "requests/s":
                line += f": {int(-(-check.target // cap))} replicas would"
        elif check.name == "memory":
            line += (
                f"; weights {memory.weights_bytes:,} + runtime {memory.runtime_overhead_bytes:,} + KV pool "
                f"{memory.kv_pool_bytes:,} bytes: lower runtime.kv_cache.memory_budget or quantize the weights"
            )
        lines.append(line)
    return lines
