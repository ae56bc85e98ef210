"""The data every part of the runtime shares: a request, its sampling parameters, its events and results,
the engine's counters, and what the scheduler hands the model each step.

Plain frozen dataclasses (a GenerationRequest aside) so tests assert on plain data. This module sits at the
top of `servegate.runtime` and imports nothing from it, as nano-vllm keeps `sampling_params.py`: engine/,
model/, scheduling/, failure_policy/, remote/ and the modules beside them all import it, so none of them
has to import another for a type. The Engine protocol itself is `engine/interface.py`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from servegate.contracts.constraint_fields import OutputConstraint
from servegate.contracts.errors import ServingError
from servegate.contracts.tool_fields import ToolUse


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen for one request (temperature 0 is greedy)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    seed: int | None = None
    """Per-request seed: same seed, same output. None: the manifest's runtime.seed."""
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    """Return the log-probability of each chosen token."""
    top_logprobs: int = 0
    """Also return the top-N alternatives per position (0: none)."""
    ignore_eos: bool = False
    """Keep generating past EOS (benchmarks that need exact output lengths)."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token the output already holds (vLLM: output tokens only)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time the output already holds it."""
    repetition_penalty: float = 1.0
    """Divides a positive logit (multiplies a negative one) of every token in the prompt or the output."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits before anything else reshapes them."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the likeliest token's (after temperature)."""
    min_tokens: int = 0
    """Tokens generated before EOS, a stop token id or a stop string may end the output."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the output (kept in token_ids, not in the text), besides EOS."""
    include_stop_str: bool = False
    """Keep the stop string that ended the output at the end of the text (vLLM's include_stop_str_in_output)."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the text (False: they are written; EOS and stop token ids never are)."""
    tokens_as_ids: bool = False
    """Name tokens in logprobs as `token_id:<id>` (vLLM's return_tokens_as_token_ids), not by their text."""
    constraint: OutputConstraint | None = None
    """The schema, regex, choice or grammar every output token is masked by (None: unconstrained)."""
    tool_use: ToolUse | None = None
    """The tool calls the output is read for (None: plain text, tool_choice none included)."""

    def penalises(self) -> bool:
        """Whether a presence, frequency or repetition penalty is asked for."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    def reshapes_logits(self) -> bool:
        """Whether a penalty, a bias or min_tokens changes the logits before sampling (greedy included)."""
        return self.penalises() or bool(self.logit_bias or self.min_tokens)


_TOKEN_ID_NAME = re.compile(r"token_id:(\d+)")
"""vLLM's `return_tokens_as_token_ids` names a token by its id."""


def token_id_name(token: int) -> str:
    """A token named by its id, as vLLM's return_tokens_as_token_ids writes it."""
    return f"token_id:{token}"


def token_id_of(name: str) -> int | None:
    """The id a `token_id:<id>` name names (None: the name is a token's text)."""
    found = _TOKEN_ID_NAME.fullmatch(name)
    return None if found is None else int(found.group(1))


@dataclass(frozen=True)
class PromptOptions:
    """How a request's prompt is rendered and cut, beyond the manifest's own rules (vLLM's request fields)."""

    add_generation_prompt: bool = True
    """End a chat prompt with the template's assistant header."""
    continue_final_message: bool = False
    """Leave the final chat message open, so the answer continues it."""
    template_kwargs: tuple[tuple[str, Any], ...] = ()
    """More variables for the chat template, as (name, value) pairs."""
    chat_template: str | None = None
    """The request's own Jinja chat template (None: the manifest's)."""
    truncate_prompt_tokens: int | None = None
    """Keep at most this many prompt tokens (None: no request truncation; the manifest's rule still applies)."""
    truncation_side: Literal["left", "right"] | None = None
    """Which tokens truncate_prompt_tokens keeps: `left` the last, `right` the first (None: left, as vLLM)."""


@dataclass
class GenerationRequest:
    """One request as the engine sees it, after the HTTP layer or file reader has parsed it."""

    id: str
    prompt: str | None = None
    """Completion prompt text (exactly one of prompt, messages, prompt_token_ids)."""
    messages: list[dict[str, Any]] | None = None
    """Chat messages [{"role", "content"}, plus "tool_calls" or "tool_call_id"], rendered with the manifest's
    chat template."""
    tools: list[dict[str, Any]] | None = None
    """The functions offered ([{"type": "function", "function": {...}}]), rendered by the chat template."""
    prompt_token_ids: list[int] | None = None
    """Pre-tokenized prompt (bench and tests)."""
    params: SamplingParams = field(default_factory=SamplingParams)
    prompt_options: PromptOptions = field(default_factory=PromptOptions)
    """The request's own rendering and truncation of its prompt."""
    tenant: str | None = None
    """Tenant id; scopes the prefix and response caches. Never logged."""
    arrival_time: float | None = None
    """time.monotonic() at arrival (None: when submitted); the deadline counts from it."""
    timeout_s: float | None = None
    """Overrides failure_policy.request_timeout_s for this request."""
    from_api: bool = False
    """Built by `runtime/request_translator` from a body `contracts/requests.parse_request` validated: admission
    checks none of its fields again. False (a request built in code): admission checks its sampling fields and
    token ids with the API's own rules and words (`contracts/field_checks`)."""


@dataclass(frozen=True)
class Usage:
    """Token counts of one request; truncated_tokens is never hidden."""

    prompt_tokens: int
    completion_tokens: int
    truncated_tokens: int = 0
    """Prompt tokens dropped by the truncation policy."""
    cached_tokens: int | None = None
    """Prompt tokens read from the KV prefix cache; None where no prefix cache is declared (or the remote
    does not say)."""

    @property
    def total_tokens(self) -> int:
        """prompt + completion tokens."""
        return self.prompt_tokens + self.completion_tokens


TokenSource = Literal["engine", "remote", "logprobs", "tokenizer"]
"""Where a result's token ids come from: `engine`, the ids the engine generated; `remote`, a remote's own ids
(vLLM's return_token_ids); `logprobs`, a remote's logprobs tokens read as ids with the manifest's tokenizer;
`tokenizer`, a remote's text re-tokenized with the manifest's tokenizer (no EOS: the text decides equality)."""


@dataclass(frozen=True)
class TokenEvent:
    """New output text for a request (one or more tokens)."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    """Text delta since the previous event (stop strings already trimmed)."""
    logprobs: tuple[float, ...] | None = None
    time: float = 0.0
    """time.monotonic() when the tokens were produced."""
    cached: bool = False
    """The whole output, replayed from the response cache (its FinishEvent follows at once)."""
    top_logprobs: tuple[dict[str, float], ...] | None = None
    """Per token, its top alternatives (only when the request asks for top_logprobs)."""
    tokens: tuple[str, ...] | None = None
    """Each token's own text as the engine names it (a remote's logprobs tokens); None: the tokenizer names them."""


@dataclass(frozen=True)
class FinishEvent:
    """A request's final result."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: Literal["stop", "length", "eos"]
    usage: Usage
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[dict[str, float], ...] | None = None
    tokens: tuple[str, ...] | None = None
    """Each output token's own text as the engine names it (a remote's logprobs tokens), one per logprob;
    None: the tokenizer names them from token_ids."""
    token_source: TokenSource = "engine"
    """Where token_ids come from (TokenSource)."""
    fallback_used: bool = False
    """Served by the fallback model."""
    cached: bool = False
    """Served from the response cache."""
    output_valid: bool | None = None
    """Whether the text satisfied output_schema (None: no schema declared)."""
    ttft_s: float | None = None
    """Seconds from arrival to first token."""
    e2e_s: float | None = None
    """Seconds from arrival to finish."""


@dataclass(frozen=True)
class ErrorEvent:
    """A request's final catalogued error (it never also gets a FinishEvent)."""

    request_id: str
    error: ServingError


Event = TokenEvent | FinishEvent | ErrorEvent
Result = FinishEvent | ErrorEvent
Sink = Callable[[Event], None]
"""Receives one request's events, in order."""


@dataclass(frozen=True)
class PromptLogprobs:
    """The log-probability of every prompt token given the tokens before it (one prefill, nothing sampled)."""

    request_id: str
    token_ids: tuple[int, ...]
    """The prompt as the model saw it: after the chat template and the truncation policy."""
    logprobs: tuple[float | None, ...]
    """log p(token_i | tokens_<i) per token; None for the first token (nothing precedes it)."""
    greedy: tuple[bool, ...]
    """Whether each token was the most likely one at its position (the first token: True)."""
    truncated_tokens: int = 0
    """Prompt tokens dropped by the truncation policy (the kept ones are scored)."""
    top: tuple[dict[int, float], ...] = ()
    """Per position, the most likely tokens {token id: log-probability}, as many as the request's
    params.top_logprobs (at least 1); empty for the first position, and where a remote did not say."""
    ranks: tuple[int | None, ...] = ()
    """Per position, the token's rank in the vocabulary there (1: the likeliest); None for the first token, and
    where a remote did not say (empty: not known at all)."""


ScoreResult = PromptLogprobs | ErrorEvent


@dataclass(frozen=True)
class EngineStats:
    """Live counters, exported as metrics by the server."""

    queue_depth: int = 0
    running: int = 0
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_misses: int = 0
    response_cache_hits: int = 0
    fallback_uses: int = 0
    preemptions: int = 0


# --- the prompt encoder: what turns a request into prompt tokens (preprocess.Preprocessor) ----------------


class EncodedPromptLike(Protocol):
    """A request's prompt as model input (preprocess.EncodedPrompt)."""

    @property
    def token_ids(self) -> Sequence[int]:
        """Prompt tokens after the chat template and the truncation policy."""

    @property
    def truncated_tokens(self) -> int:
        """Prompt tokens the truncation policy dropped."""


class PromptEncoder(Protocol):
    """Turns a request into prompt tokens as the manifest says (preprocess.Preprocessor)."""

    vocab_size: int
    """The tokenizer's vocabulary size: token ids are 0 to vocab_size - 1."""

    def encode(self, request: GenerationRequest) -> EncodedPromptLike:
        """The request's prompt tokens (raises ServingError for a request the manifest refuses)."""


# --- the model runner: what the engine's scheduler hands the model each step ------------------------


@dataclass(frozen=True)
class SeqChunk:
    """The tokens of one sequence computed in one step (a prefill chunk, or one decode token)."""

    seq_id: int
    token_ids: tuple[int, ...]
    """New tokens fed this step; token_ids[0] sits at position start_pos."""
    start_pos: int
    """Tokens of this sequence already in the KV cache (computed earlier, or prefix-cache hits)."""
    block_table: tuple[int, ...]
    """KV block ids covering positions [0, start_pos + len(token_ids)), in order."""


class ModelRunner(Protocol):
    """Runs one step of a model over a ragged batch, reading and writing the paged KV pool."""

    block_size: int
    num_blocks: int
    vocab_size: int
    eos_token_ids: frozenset[int]

    def execute(self, chunks: Sequence[SeqChunk]) -> Any:
        """Write the chunks' KV into their blocks and return float32 logits [len(chunks), vocab]
        at each chunk's last token."""
