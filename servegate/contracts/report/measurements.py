"""Each built-in gate's measurements as the check report holds them: one record per gate, each field's unit in its
docstring. The JSON keys are the field names; `unmeasured()` fields are left out when not measured.

The capacity gate's latency figures are the bench's own JSON (`gate bench --json`), kept as written.
"""

from __future__ import annotations

from pydantic import ConfigDict, JsonValue

from servegate.contracts.report.base import JsonObject, ReportRecord, unmeasured
from servegate.contracts.report.probes import (
    ProbesUnderLoad,
    QualityUnderLoad,
    StreamingUnderLoad,
    StructuredUnderLoad,
    TimingAudits,
)


class Measurements(ReportRecord):
    """What a gate measured; every gate's record extends it. With no field of its own it says nothing was
    measured (a skipped gate, or one that stopped before measuring)."""

    ran_on: str | None = unmeasured()
    """Where a remote candidate ran (engine, version, model, URL); absent for the reference runtime. Written
    last, as the remote label is added after the gate ran."""


class OtherMeasurements(Measurements):
    """A third-party gate's measurements: its own keys, kept as JSON values."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, JsonValue]


class BatchingMeasurements(Measurements):
    """What the batching gate compared, and how requests past their deadline ended."""

    mode: str
    """The batching mode under test (none, static, dynamic, continuous)."""
    max_batch_size: int
    """The most requests in one batch (requests)."""
    probes: int
    """Probe prompts sent in every arrangement (prompts)."""
    arrangements: list[str]
    """The arrangements each probe ran in (labels: one at a time, in order, reversed, shuffled)."""
    outputs_compared: int
    """Outputs compared with the unbatched reference, over all arrangements (outputs)."""
    mismatches: int
    """Outputs whose text, tokens or error differ from the unbatched reference (outputs)."""
    mismatch_rate: float
    """mismatches / outputs_compared (fraction, 0 to 1)."""
    expired_request: str
    """How a request whose deadline passed before it arrived ended (an error code, or `an answer`)."""
    finished_after_deadline: int
    """Requests that finished later than failure_policy.request_timeout_s plus the slack (requests)."""
    token_source: str = "engine"
    """Where the candidate's output tokens came from (engine, remote, logprobs, tokenizer; several joined by
    ', '); with `tokenizer` the texts alone decide equality."""
    numerical_ties: int = 0
    """Mismatches whose first differing token the unbatched reference ranks within the tie limit of its own
    choice (float rounding that depends on the batch's size, gates/checks/batching_ties.py): a warning, not a
    failure (outputs)."""


class CachingMeasurements(Measurements):
    """Which caches are on, and the cache hits the probe passes saw (absent when no probe ran)."""

    caches: list[str]
    """The caches the candidate enables (prefix cache, response cache)."""
    tenants_identified: bool
    """Whether preprocess.tenant_from identifies tenants."""
    shared_across_tenants: list[str]
    """The enabled caches whose entries every tenant shares (empty when each is scoped per tenant)."""
    probes: int | None = unmeasured()
    """Probe prompts sent in each pass (prompts)."""
    cold_prefix_hits: int | None = unmeasured()
    """Prefix-cache hits in the cold pass: prompts sharing a prefix within the pass (hits)."""
    warm_prefix_hits: int | None = unmeasured()
    """Prefix-cache hits in the warm pass (hits)."""
    repeat_response_hits: int | None = unmeasured()
    """Response-cache hits when the cold pass is repeated (hits)."""
    tenant_b_extra_hits: int | None = unmeasured()
    """Hits tenant B got beyond the cold pass's own, from tenant A's entries (hits; 0 when tenants are apart)."""
    stale_hits_after_fingerprint_change: int | None = unmeasured()
    """Hits an engine with a changed fingerprinted field got beyond the cold pass's own (hits)."""
    output_mismatches: int | None = unmeasured()
    """Cached outputs that differ from the cold output (outputs)."""
    prefix_cache_observable: bool | None = unmeasured()
    """False when the prefix cache runs inside a remote, where its hits cannot be counted."""
    timing_audits: TimingAudits | None = unmeasured()
    """The black-box response-cache detector and tenant isolation audit, timed over HTTP (docs/cache-audits.md)."""


class CapacityMeasurements(Measurements):
    """The bench at the declared workload: latency and throughput as measured, each target's check, memory."""

    ttft_ms: JsonObject
    """Time to first token (milliseconds): mean, p50/p95/p99 with their intervals, count."""
    tpot_ms: JsonObject
    """Time per output token after the first (milliseconds): as ttft_ms."""
    e2el_ms: JsonObject
    """End-to-end latency of a request (milliseconds): as ttft_ms."""
    throughput: JsonObject
    """requests_per_s (requests/s) and output_tokens_per_s (tokens/s) over the bench."""
    goodput: JsonObject
    """requests_per_s (requests/s) within the SLO, the fraction (0 to 1) within it, and the SLO (milliseconds)."""
    requests: dict[str, int]
    """Requests sent, completed and failed (requests)."""
    targets: list[JsonObject]
    """One check per declared target: name, target, predicted (the measured value), unit, verdict, met, missed_by."""
    memory_total_bytes: int | None
    """The planned memory (weights, KV pool, runtime estimate) in bytes; None when not planned."""
    peak_memory_bytes: int | None
    """Peak resident memory of the server process, or a remote's own report (bytes); None when not measured."""
    machine_speed: JsonObject | None
    """This machine's speed probe during the bench (microseconds per probe, spread, steady); None when not run."""
    client_limited: bool | None
    """Whether the load generator, not the server, limited the rate."""
    load_average: JsonObject | None
    """The system load average before and after the bench, the CPUs, and whether they were oversubscribed."""
    paired: bool
    """Whether the candidate was benched interleaved with the baseline (a change), not alone."""
    memory_unchecked: str | None = unmeasured()
    """Why the memory target was not checked; absent when it was."""
    contention: JsonObject | None = unmeasured()
    """For a server benched here: the contention probe's figures and whether its cores were contended, and why."""
    control: JsonObject | None = unmeasured()
    """After a miss on a machine that seemed to hold: the reference form benched interleaved with the candidate,
    its per-round p50s and spread, the candidate's verdict in that bench, whether the machine moved and why."""


class RemoteIdentity(ReportRecord):
    """What a remote reported about itself."""

    engine: str
    """`vllm`, `servegate`, or what the server calls itself (`unknown` when it does not say)."""
    version: str | None
    """The engine's version, when it reports one."""
    models: list[str]
    """Model ids from /v1/models."""
    max_model_len: int | None = None
    """Context length the remote reports for the served model (tokens), else None."""


class ContractMeasurements(Measurements):
    """What the contract gate probed: over HTTP (the probes and codes), or on the engine alone."""

    remote: RemoteIdentity | None = unmeasured()
    """The identity a remote reported, when it differs from the manifest (the drift failure)."""
    http_checked: bool | None = unmeasured()
    """False when servegate.server was unavailable and only the engine-level checks ran."""
    probes: int | None = unmeasured()
    """HTTP probes sent, one per catalogued behaviour and variant (probes)."""
    codes_provoked: list[str] | None = unmeasured()
    """Catalogue error codes the probes provoked."""
    not_provokable: dict[str, str] | None = unmeasured()
    """Catalogue error codes no request can provoke from outside (e.g. an internal error), with the reason."""
    prompts_checked: int | None = unmeasured()
    """Prompts whose outputs were checked for validity, streaming and seeding (prompts)."""
    structured_under_load: StructuredUnderLoad | None = unmeasured()
    """Schema validity and answer size at concurrency 1 and under load."""
    constraints_under_load: ProbesUnderLoad | None = unmeasured()
    """Every allowed output-constraint kind alone and under load."""
    tools_under_load: ProbesUnderLoad | None = unmeasured()
    """Every forced tool_choice mode alone and under load."""
    checked: dict[str, str] | None = unmeasured()
    """How each measured field was checked: field -> `reported` / `measured` and what was seen."""
    not_verified: list[str] | None = unmeasured()
    """Fields that could be neither read nor measured, each with why (the verdict is then warn)."""
    field_requests: int | None = unmeasured()
    """Requests the field measurements sent: the seed draws and the context probe (requests)."""


class LoadMeasurements(Measurements):
    """What the load gate measured: where, at what concurrency, and both checks' figures."""

    target: str
    """Where the answers came from (servegate's server in process, or the remote directly)."""
    concurrency: int
    """Requests kept in flight during the load phase."""
    concurrency_from: str
    """The manifest field the concurrency comes from."""
    requests: int
    """Requests of the load phase (sample items twice, plus the other prompts that keep it full)."""
    load_phase_s: float
    """Seconds the load phase took."""
    throughput_rps: float
    """Requests/s completed during the load phase."""
    quality: QualityUnderLoad
    """The sample's outputs under load against the same items sent alone."""
    streaming: StreamingUnderLoad
    """Every streamed answer against its non-streamed twin, usage, end of sequence and max_tokens."""
