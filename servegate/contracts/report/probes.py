"""The records of what was measured over HTTP: checks under load, probe phases and the cache timing audits."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field

from servegate.contracts.report.base import ReportRecord, Verdict
from servegate.contracts.report.quality import PairedTest


class SuitePairedTest(PairedTest):
    """A paired test with the suite it was run on (the load gate's paired comparison)."""

    suite: str
    """The suite the test ran on."""


class QualityUnderLoad(ReportRecord):
    """Outputs of the sample under load against the same items sent alone."""

    comparison: str
    """`token-exact` (the batching promises greedy equality) or `paired non-inferiority`."""
    items: int
    """Sample items sent alone and under load (items)."""
    mismatches: int
    """Items whose text under load differs from their text at rest, or that were refused under load (items)."""
    mismatch_rate: float
    """mismatches / items (fraction, 0 to 1)."""
    refused_under_load: int
    """Sample items that answered alone but were refused under load (items)."""
    tests: tuple[SuitePairedTest, ...] = ()
    """The paired tests when the comparison is paired."""
    numerical_ties: int = 0
    """Items that differed only from a numerical tie on (token-exact comparison; gates/checks/batching_ties.py):
    not counted in mismatches, a warning (items)."""


class StreamingUnderLoad(ReportRecord):
    """What the streaming-consistency check measured at the declared concurrency."""

    concurrency: int
    """Requests kept in flight while the streams ran."""
    streams: int
    """Streamed answers checked against their non-streamed twin."""
    answers: int
    """Answers (streamed and not) whose usage, end of sequence and max_tokens were checked."""
    refused: int
    """Answers that came back as errors (not compared; a refusal is the contract gate's business)."""
    twin_mismatches: int
    """Streamed answers whose text differs from the non-streamed twin's."""
    first_token_mismatches: int
    """Streamed answers whose first chunk is not the beginning of the final text."""
    end_of_sequence_violations: int
    """Answers with no or several finish_reasons, or text after the finish."""
    usage_miscounts: int
    """Answers whose usage.completion_tokens is missing or differs from the tokens received."""
    max_tokens_exceeded: int
    """Answers with more tokens (received or reported) than the max_tokens asked for."""
    token_count: str
    """How tokens received were counted: `token ids` sent by the server, or `tokenizer` on the text."""


class StructuredPhase(ReportRecord):
    """Answers of one phase: how many were valid under output_schema, and how large they were."""

    concurrency: int
    """Requests in flight during the phase (1: alone)."""
    stream: bool
    """Whether the phase's answers were streamed."""
    answers: int
    """Answers received (refusals included)."""
    valid: int | None
    """Answers that are JSON valid under output_schema (None when no schema is declared)."""
    validity: float | None
    """Share of answers valid under output_schema (fraction, 0 to 1; None without a schema)."""
    bytes_max: int
    """Largest answer (bytes of UTF-8)."""
    bytes_mean: float
    """Mean answer size (bytes of UTF-8)."""
    over_limit: int
    """Answers longer than postprocess.max_output_bytes."""


class StructuredUnderLoad(ReportRecord):
    """Structured output at concurrency 1 and at the declared concurrency, streamed and not."""

    target: str
    """Where the answers came from (servegate's server in process, or the remote directly)."""
    margin: float
    """Largest allowed drop of validity under load (fraction)."""
    max_output_bytes: int | None
    """postprocess.max_output_bytes, when declared (bytes)."""
    phases: tuple[StructuredPhase, ...]
    """The four phases: concurrency 1 and under load, each not streamed and streamed."""


class ProbePhase(ReportRecord):
    """The answers of one probe in one phase."""

    probe: str
    """What was probed: a constraint kind, a tool_choice mode."""
    concurrency: int
    """Requests in flight during the phase (1: alone)."""
    stream: bool
    """Whether the answers were streamed."""
    answers: int
    """Answers received (refusals included)."""
    ended: int
    """Answers that ended, so could be judged."""
    broken: int
    """Ended answers that are broken, and answers the server refused as invalid_output."""


class ProbesUnderLoad(ReportRecord):
    """Every probe at concurrency 1 and at the declared concurrency, streamed and not."""

    target: str
    """Where the answers came from (servegate's server in process, or the remote directly)."""
    phases: tuple[ProbePhase, ...]
    """Four phases per probe."""
    first_broken: str | None
    """The first broken answer, as the judge described it (None when none broke)."""


class RepeatTiming(ReportRecord):
    """What the response-cache detector measured and found (medians in milliseconds)."""

    pairs: int
    """Rounds timed (each: a first send, then a repeat, another seed, a never-seen prompt)."""
    declared: bool
    """Whether the manifest declares a response cache (postprocess.response_cache.enabled)."""
    repeat_median_ms: float
    """Exact repeats (ms)."""
    other_seed_median_ms: float
    """The same prompt with another seed (ms)."""
    unseen_median_ms: float
    """Never-seen prompts of the same shape: what an uncached answer costs (ms)."""
    first_send_median_ms: float
    """The probe prompts' first sends (ms; reported, not judged)."""
    speedup: float
    """Never-seen median / repeat median."""
    seed_speedup: float
    """Other-seed median / repeat median (about 1: the seed is ignored)."""
    max_speedup: float
    """The largest speed-up taken for no cache."""
    p_seed_faster: float
    """One-sided Mann-Whitney p that other-seed times exceed max_speedup x repeat times."""
    p_seed_within: float
    """p that other-seed times stay below max_speedup x repeat times."""
    p_unseen_faster: float
    """p that never-seen times exceed max_speedup x both the repeat and the other-seed times."""
    p_unseen_within: float
    """p that never-seen times stay below max_speedup x repeat times."""
    alpha: float
    """Level each look is judged at."""
    header_hits: int
    """Repeats servegate's X-Servegate-Cache header marked `hit`."""
    ignore_eos: bool
    """Whether the audit's requests asked for exactly max_tokens tokens."""
    unseen_unit: str
    """What the never-seen prompts' length was matched in: `tokens` or `characters`."""
    unseen_shape_mismatches: int
    """Never-seen prompts whose prompt_tokens differed from their probe's."""
    unseen_length_mismatches: int
    """Never-seen answers of another length than the probe's."""
    finding: Literal["cache", "cache_ignores_seed", "no_cache", "inconclusive"]
    """What the timing says."""
    verdict: Verdict
    """The audit's verdict, from the finding and what the manifest declares."""
    reason: str
    """One line naming the figures."""


class TenantTiming(ReportRecord):
    """What the tenant isolation audit measured and found (times to first token, milliseconds)."""

    samples: int
    """Requests per side."""
    prompt_tokens: int
    """Mean prompt length of the audit prompts (tokens)."""
    tokens_counted_by: Literal["server", "tokenizer", "characters"]
    """Who counted prompt_tokens."""
    fresh_median_ms: float
    """Fresh prompts (ms)."""
    cross_median_ms: float
    """Tenant B on tenant A's prompts (ms)."""
    own_median_ms: float
    """Tenant A's own repeats (ms)."""
    p_own_faster: float
    """Mann-Whitney p (one-sided) that A's own repeats are faster than fresh prompts."""
    p_cross_faster: float
    """p that tenant B on A's prompts is faster than fresh prompts."""
    p_cross_slower_than_own: float
    """p that tenant B on A's prompts is slower than A's own repeats."""
    leak_share: float | None
    """(fresh - cross) / (fresh - own) of the medians (None: no speed-up)."""
    alpha: float
    """The level judged at."""
    detectable_shift_sd: float
    """Shift in standard deviations this sample finds with power 0.9 at alpha."""
    finding: Literal["shared", "isolated", "inconclusive"]
    """What the timing says."""
    verdict: Verdict
    """The audit's verdict."""
    reason: str
    """One line naming the figures."""


class TimingAudits(ReportRecord):
    """The response-cache detector and the tenant isolation audit, each None when it did not run (and why)."""

    response_cache: RepeatTiming | None
    """The response-cache detector."""
    isolation: TenantTiming | None = Field(validation_alias=AliasChoices("isolation", "tenant_isolation"))
    """The tenant isolation audit (not `tenant_...`: the note's public filter drops text under keys naming
    tenants)."""
    not_run: tuple[str, ...] = ()
    """Why an audit did not run."""
    problem: str | None = None
    """Why the audits stopped (a request that failed), when they did."""
