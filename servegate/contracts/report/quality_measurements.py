"""The measurements of the gates that compare answers on suites: quality, quantization, truncation, fallback."""

from __future__ import annotations

from servegate.contracts.report.base import JsonObject, ReportRecord, unmeasured
from servegate.contracts.report.measurements import Measurements
from servegate.contracts.report.quality import BoundaryCheck, NextToken, SuiteScores


class QualityMeasurements(Measurements):
    """What the quality gate compared: the fields taken from the candidate, each suite's tests, divergence."""

    compared_fields: list[str]
    """The changed fields the isolated candidate took from the candidate (`(whole candidate)` when forced)."""
    suites: dict[str, SuiteScores]
    """Suite name -> its items and per-metric paired tests."""
    next_token: NextToken
    """Suite name -> next-token agreement (fraction) and KL divergence (nats), or {"unavailable": why}."""


class CheckpointScheme(ReportRecord):
    """A checkpoint's quantization as its own files record it."""

    format: str
    """weights.format: safetensors, pickle, compressed-tensors or gguf."""
    scheme: str
    """Short name: W4A16, W8A8, W8A8-FP8 (compressed-tensors), Q4_K_M, Q8_0 (GGUF file type), or none."""
    weight_bits: int | None = None
    """Bits per quantized weight (the most common tensor type's, for a GGUF)."""
    group_size: int | None = None
    """Weights per quantization group; None for per-channel or per-tensor scales."""
    strategy: str | None = None
    """How weight scales are shared: group, channel, tensor, block, or the GGUF block type."""
    activations: str | None = None
    """How activations are quantized ("int8 dynamic per token"), or None when they stay in the compute dtype."""
    storage: str | None = None
    """The on-disk encoding: a compressed-tensors format or the GGUF tensor types with counts."""
    targets: list[str] = []
    """What the quantized config groups name: layer classes, module names or `re:` patterns."""
    ignored: list[str] = []
    """Layers the scheme leaves unquantized (e.g. lm_head)."""
    toolchain: str | None = None
    """What made the checkpoint, with its version where recorded."""
    calibration: JsonObject | None = None
    """The calibration set the toolchain recorded (file, sha256, samples), or None when the files do not say."""
    recipe: str | None = None
    """The toolchain's recipe as it saved it, when present."""
    executed_as: str = "as stored"
    """How servegate's reference runtime runs it (dequantized at load, activations simulated, ...)."""
    notes: list[str] = []
    """Anything else a reader of the report should know about this build."""


class QuantizationMeasurements(Measurements):
    """The candidate's precision settings and, when suites are declared, each suite's paired tests."""

    method: str
    """runtime.quantization.method (e.g. none, int8-weight, int4-weight)."""
    simulated: bool
    """Whether the runtime simulates the scheme by round-tripping weights instead of running it."""
    group_size: int | None
    """Weights per quantization group (weights); None for schemes without groups."""
    dtype: str
    """runtime.dtype: the activations' and unquantized weights' precision."""
    kv_cache_dtype: str | None
    """runtime.kv_cache.dtype; None without a paged KV cache."""
    calibration: JsonObject | None
    """The calibration suite's name, split, item count and sha256 of its items; None when undeclared."""
    checkpoint: CheckpointScheme | None = unmeasured()
    """A toolchain checkpoint's own scheme (compressed-tensors, GGUF) and how the reference runtime ran it;
    absent for load-time schemes."""
    parent: str | None = unmeasured()
    """The weights the checkpoint is compared with (the baseline's source), when the candidate is a checkpoint."""
    suites: dict[str, SuiteScores] | None = unmeasured()
    """Suite name -> its items and per-metric paired tests."""
    next_token: NextToken | None = unmeasured()
    """Suite name -> next-token agreement (fraction) and KL divergence (nats), or {"unavailable": why}."""


class OverLimitScores(ReportRecord):
    """The suite's first metric on the prompts over the limit only, with full context and under the policy."""

    metric: str
    """The metric compared (the suite's first)."""
    full_context: float
    """Its mean on those prompts with the whole prompt (fraction, 0 to 1)."""
    under_policy: float
    """Its mean on those prompts under the candidate's limit and policy (fraction, 0 to 1)."""


class TruncationSuite(ReportRecord):
    """What the limit does to one suite: how many prompts it cuts, the tokens lost, and rejections."""

    items: int
    """Items in the suite (items)."""
    over_limit: int
    """Prompts longer than the candidate's limit (items)."""
    share_over_limit: float
    """over_limit / items (fraction, 0 to 1)."""
    over_reference_limit: int
    """Prompts the reference form itself could not take whole (items)."""
    unaffected_rechecked: int
    """Prompts under the limit re-run to confirm they come back unchanged (items)."""
    tokens_lost_total: int
    """Prompt tokens dropped over all answered prompts over the limit (tokens)."""
    tokens_lost_mean: float
    """Prompt tokens dropped per answered prompt over the limit (tokens)."""
    tokens_lost_max: int
    """The most prompt tokens dropped from one prompt (tokens)."""
    rejected: int
    """Prompts over the limit answered input_too_long (items)."""
    over_limit_scores: OverLimitScores | None = unmeasured()
    """The first metric on the prompts over the limit alone; absent when no prompt is over it."""


class TruncationMeasurements(Measurements):
    """The limit and policy under test, what they do to each suite, and the paired tests of the whole suites."""

    limit_tokens: int
    """preprocess.max_input_tokens of the candidate (tokens)."""
    policy: str
    """preprocess.truncation of the candidate (left, right, middle, reject)."""
    per_suite: dict[str, TruncationSuite]
    """Suite name -> what the limit does to it."""
    suites: dict[str, SuiteScores]
    """Suite name -> the per-metric paired tests of the whole suite, the candidate's results spliced in."""
    token_source: str = "engine"
    """Where the candidate's output tokens came from (engine, remote, logprobs, tokenizer; several joined by
    ', '); with `tokenizer` the texts alone decide whether an item came back unchanged."""
    long_prompt_notes: list[str] | None = unmeasured()
    """Suites whose prompts over the limit fail on their own though the whole suite passes; absent on a failure."""


class ForcedRouting(ReportRecord):
    """Requests sent while one trigger (overload, a missed deadline) was forced on the primary."""

    sent: int
    """Requests sent (requests)."""
    answered: int
    """Requests that ended in an answer or a catalogued error (requests)."""
    routed_to_fallback: int
    """Answers the fallback gave (requests)."""
    errors: dict[str, int]
    """Error code -> requests that ended with it."""
    errors_after_first_token: int
    """Trigger errors on streams that had already sent tokens, where switching models is not allowed (requests)."""


class FallbackMeasurements(Measurements):
    """The declared fallback, its output contract and boundary per suite, and how forced failures were routed."""

    fallback: str
    """The fallback manifest's name."""
    triggers: list[str]
    """failure_policy.fallback.triggers: the failures it takes over (overload, timeout)."""
    boundary: dict[str, float]
    """failure_policy.fallback.boundary: metric -> the floor the fallback's score must keep (fraction, 0 to 1)."""
    contract: dict[str, SuiteScores]
    """Suite name -> paired tests of the validity metrics, the fallback against the primary."""
    boundaries: dict[str, BoundaryCheck]
    """`suite/metric` -> the fallback's score against its declared floor."""
    routing: dict[str, ForcedRouting]
    """Trigger (overload, timeout) -> how the forced requests ended; empty with no suite items to send."""
