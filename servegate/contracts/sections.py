"""The six elements of a served model, one pydantic model each.

    served model = (weights, preprocess, runtime, batching, postprocess, failure policy)

Every field carries a docstring (exported as its JSON Schema description), limits and, where one is
safe, a default. Unknown keys are errors (`extra="forbid"`): a typo must fail loudly.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from servegate.contracts.engine_sections import (
    BackendQuestions,
    EngineIdentity,
    LlamaCppProcess,
    Parallelism,
    VllmProcess,
)
from servegate.contracts.section_base import Section, check_json_schema
from servegate.contracts.structured_section import StructuredOutput
from servegate.contracts.tools_section import ToolCalling
from servegate.contracts.units import ByteSize

DType = Literal["auto", "float32", "float16", "bfloat16"]
WeightsFormat = Literal["safetensors", "pickle", "compressed-tensors", "gguf"]
QUANTIZED_FORMATS = ("compressed-tensors", "gguf")
"""Weights formats whose files are already quantized (by a toolchain such as llm-compressor or llama.cpp)."""
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_HF_SOURCE = re.compile(r"^hf:[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
_ZOO_SOURCE = re.compile(r"^zoo:[a-z0-9][a-z0-9-]*$")


# --- weights ---------------------------------------------------------------------------------------


class Weights(Section):
    """Where the checkpoint comes from and how it is verified before it is loaded."""

    source: str = Field(min_length=1)
    """`zoo:NAME` (a model shipped with servegate), a local directory, or `hf:ORG/NAME@REVISION`."""
    format: WeightsFormat = "safetensors"
    """File format of the weights: `safetensors`; `pickle` (torch .bin files, also needs `allow_pickle: true`);
    `compressed-tensors` (a quantized checkpoint as llm-compressor writes it: safetensors plus a
    `quantization_config` in config.json); `gguf` (a llama.cpp file, see `gguf_file`)."""
    gguf_file: str | None = None
    """With `format: gguf`, the .gguf file inside `source` (may be left out when the folder holds exactly one)."""
    derived_from: str | None = None
    """The unquantized parent this checkpoint was made from: a manifest file (its `weights` section) or a weights
    source (`zoo:NAME`, a folder, `hf:ORG/NAME@REV`) in safetensors. The reference form runs the parent's weights,
    so `gate check` measures the quantized checkpoint against the checkpoint it came from."""
    allow_pickle: bool = False
    """Allow loading pickle weight files, which can run arbitrary code when loaded."""
    sha256: dict[str, str] = Field(default_factory=dict)
    """Expected sha256 of weight files (file name relative to the source -> hex digest); checked before load."""
    dtype: DType = "auto"
    """The dtype the weights are loaded in (`auto`: as stored)."""

    @field_validator("source")
    @classmethod
    def _source_form(cls, value: str) -> str:
        if value.startswith("zoo:") and not _ZOO_SOURCE.match(value):
            raise ValueError(f"zoo names are lowercase letters, digits and '-', e.g. zoo:tiny-primary (got {value!r})")
        if value.startswith("hf:") and not _HF_SOURCE.match(value):
            raise ValueError(f"hub sources are written hf:ORG/NAME@REVISION (got {value!r})")
        return value

    @field_validator("sha256")
    @classmethod
    def _digests(cls, value: dict[str, str]) -> dict[str, str]:
        for name, digest in value.items():
            if not _SHA256.match(digest):
                raise ValueError(f"sha256 of {name!r} must be 64 lowercase hex characters (got {digest!r})")
            if name.startswith("/") or ".." in name.split("/"):
                raise ValueError(f"file names in sha256 are relative to the source and stay inside it (got {name!r})")
        return value

    @model_validator(mode="after")
    def _pickle_opt_in(self) -> Weights:
        if self.format == "pickle" and not self.allow_pickle:
            raise ValueError("format: pickle can run arbitrary code when loaded: set allow_pickle: true to opt in")
        if self.gguf_file is not None and self.format != "gguf":
            raise ValueError(f"weights.gguf_file names a GGUF file but format is {self.format}: set format: gguf")
        if self.gguf_file is not None and (not self.gguf_file.endswith(".gguf") or "/" in self.gguf_file):
            raise ValueError(f"weights.gguf_file is a .gguf file name inside source (got {self.gguf_file!r})")
        if self.derived_from is not None and self.derived_from == self.source:
            raise ValueError("weights.derived_from names the checkpoint itself: name the parent it was made from")
        return self

    @property
    def derived_from_manifest(self) -> bool:
        """Whether `derived_from` names a manifest file (.yaml, .yml, .json) rather than a weights source."""
        return self.derived_from is not None and self.derived_from.lower().endswith((".yaml", ".yml", ".json"))

    @property
    def quantized_checkpoint(self) -> bool:
        """Whether the files themselves are quantized (compressed-tensors or GGUF), not quantized at load."""
        return self.format in QUANTIZED_FORMATS


# --- preprocess ------------------------------------------------------------------------------------


TemplateField = Literal["add_generation_prompt", "continue_final_message", "chat_template_kwargs", "chat_template"]
"""A chat-template request field a manifest may accept (preprocess.template_fields)."""


class Preprocess(Section):
    """What a request becomes before the model sees it: template, limits, truncation, tenant."""

    task: Literal["generate", "embed"] = "generate"
    """`generate` for causal LMs (completions, chat), `embed` for encoder models (embeddings)."""
    chat_template: str = "tokenizer"
    """`tokenizer` (the tokenizer's own template), `none` (messages joined as plain text), or a path to a Jinja file."""
    max_input_tokens: int = Field(default=1024, ge=1, le=1_048_576)
    """Most prompt tokens the model is given; longer prompts follow `truncation`."""
    max_payload_bytes: int = Field(default=1_048_576, ge=256, le=1_073_741_824)
    """Largest request body accepted, in bytes; larger bodies are refused (413) before they are parsed."""
    truncation: Literal["reject", "left", "right", "middle"] = "reject"
    """Over-long prompts: `reject` (error input_too_long), or drop tokens from the left, right or middle."""
    input_schema: dict[str, Any] | None = None
    """Extra JSON Schema that requests must also satisfy (e.g. a required `user` field)."""
    tenant_from: Literal["header", "user", "none"] = "none"
    """Where a request's tenant comes from: the X-Tenant header, the `user` field, or `none` (single tenant)."""
    unknown_fields: Literal["reject", "ignore"] = "reject"
    """Request fields outside the API, at any depth: `reject` them (400 unknown_parameter), or `ignore` the ones
    known to be harmless (metadata, stream_options.continuous_usage_stats, ...: dropped and named in the
    X-Servegate-Ignored-Fields header); a field servegate has never heard of is refused under both. Fields that
    would change the answer and are not implemented (best_of, response_format, ...: servegate.contracts.field_policy)
    are refused under both (unsupported_parameter)."""
    max_choices_per_request: int = Field(default=16, ge=1, le=1024)
    """Most choices one request may ask for: prompts x n on /v1/completions, n on chat. Each choice is its own
    engine request (queued, limited and timed like one); 1 allows a single prompt and n=1 only."""
    template_fields: list[TemplateField] = Field(default_factory=list)
    """The chat-template fields requests may set (vLLM's): add_generation_prompt, continue_final_message,
    chat_template_kwargs, and chat_template (a whole template of the request's own, as vLLM's
    --trust-request-chat-template). Any other, set to anything but its default, is unsupported_parameter."""
    unseeded_sampling: Literal["fresh", "deterministic"] = "fresh"
    """Sampling requests (temperature > 0) that give no seed: `fresh` draws a new seed for each, as OpenAI and vLLM
    do; `deterministic` seeds them with runtime.seed, so identical requests get identical text (and the response
    cache can answer repeats). Greedy requests (temperature 0) are deterministic under both."""

    @model_validator(mode="after")
    def _template_to_shape(self) -> Preprocess:
        if self.template_fields and self.chat_template == "none":
            raise ValueError("template_fields reshape a chat template's rendering: chat_template none has none")
        return self

    @field_validator("input_schema")
    @classmethod
    def _valid_input_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_json_schema(value)


# --- runtime ---------------------------------------------------------------------------------------

QuantMethod = Literal[
    "none",
    "int8-weight",
    "int8-dynamic",
    "int4-weight",
    "fp8-weight",
    "int3-weight",
    "int2-weight",
]


class Quantization(Section):
    """Weight (and activation) quantization applied to the model's linear layers."""

    method: QuantMethod = "none"
    """Quantization scheme; int2/int3 are simulated (weights round-tripped), others use torchao where it runs."""
    group_size: int = Field(default=32, ge=8, le=4096)
    """Weights per quantization group for grouped schemes (int4, int3, int2)."""
    calibration: str | None = None
    """Suite used for calibration and recorded in reports, e.g. `zoo:arith` (split `calibration`)."""
    include_lm_head: bool = False
    """Also quantize the output projection (lm_head); off by default because it costs most accuracy."""
    include_embeddings: bool = False
    """Also quantize the input embeddings."""


class WarmupPrompt(Section):
    """A prompt run at start-up whose greedy output must match before the server reports ready."""

    prompt: str = Field(min_length=1)
    """The prompt text, sent as a completion request."""
    expect: str | None = None
    """The exact greedy completion expected; `null` only checks that generation succeeds."""
    max_tokens: int = Field(default=16, ge=1, le=4096)
    """Most tokens to generate for this prompt."""


class KVCache(Section):
    """The paged KV cache: block size, memory budget and prefix caching."""

    block_size: int = Field(default=16, ge=1, le=1024)
    """Tokens per KV block."""
    memory_budget: ByteSize = Field(default=256 * 2**20, ge=1024)
    """Memory for KV blocks, as bytes or with a unit ("2GiB"); the number of blocks follows from it."""
    dtype: Literal["auto", "fp8"] = "auto"
    """KV storage dtype: `auto` (the model's compute dtype) or `fp8` (simulated: round-tripped through float8)."""
    prefix_caching: bool = False
    """Reuse KV blocks of identical prompt prefixes across requests."""
    cache_scope: Literal["tenant", "global"] = "tenant"
    """Prefix cache sharing: per `tenant` (hashes salted with the tenant) or `global` (shared by all tenants)."""


AUTO_MIN_WEIGHT_BYTES = 64 * 2**20
"""`cpu_linear: auto` routes a model only when its float linear weights exceed this (twice the test VM's 32 MiB
L3): smaller ones stay in cache, where a step costs per-call overhead rather than bandwidth, and OpenBLAS's
spinning workers only add CPU time (`gate check` on the 4.6 MB quickstart model, routed against not: wall 40.8 /
33.2 s cold / warm against 42.4 / 33.4 s, CPU 64.7 / 50.1 s against 55.9 / 47.9 s). Here, not in the runtime,
because `gate plan` counts the memory the route takes without importing torch."""


def auto_packs_for_onednn(dtype: str, linear_bytes: int) -> bool:
    """Whether `cpu_linear: auto` on CPU routes linear weights through oneDNN (given oneDNN in torch): bfloat16
    weights of AUTO_MIN_WEIGHT_BYTES or more. `dtype`: the compute dtype's name. The one statement of the rule that
    runtime/model/cpu_linear.resolve_cpu_linear applies and `gate plan` counts the packed copy by."""
    return dtype == "bfloat16" and linear_bytes >= AUTO_MIN_WEIGHT_BYTES


class Runtime(BackendQuestions, Section):
    """How the model is executed: backend, device, precision, quantization and KV cache."""

    backend: Literal["reference", "endpoint", "vllm", "llamacpp"] = "reference"
    """`reference`: servegate's in-process runtime; `endpoint`: any OpenAI-compatible server at endpoint_url; `vllm`
    (`runtime.vllm`), `llamacpp` (llama-server on a GGUF, `runtime.llamacpp`): a server servegate starts. For all but
    the first, servegate applies the preprocess, postprocess and failure policy in front of the engine."""
    endpoint_url: str | None = None
    """Base URL of the OpenAI-compatible server (e.g. http://10.0.0.5:8000/v1) when backend is `endpoint`.
    Where the remote runs, not what it serves: not part of the fingerprint."""
    endpoint_model: str | None = None
    """Model name to send to the endpoint (defaults to the manifest's name)."""
    vllm: VllmProcess | None = None
    """How servegate starts vLLM for backend: vllm (interpreter, port, log, start-up time); defaults when absent."""
    llamacpp: LlamaCppProcess | None = None
    """How servegate starts llama-server for backend: llamacpp (binary, port, log, micro-batch); defaults if absent."""
    engine: EngineIdentity | None = None
    """The engine that runs the model (name and version). For an endpoint, declare it to pin it (a remote that
    reports another engine or version fails the contract gate); left out, gate check records what the remote
    reports and fingerprints that."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device to run on; `auto` picks CUDA when present."""
    dtype: DType = "auto"
    """Compute dtype (`auto`: float32 on CPU, bfloat16 on CUDA)."""
    max_model_len: int = Field(default=2048, ge=8, le=1_048_576)
    """Longest sequence (prompt + output tokens) the runtime accepts."""
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    """Seed for sampling when a request gives none."""
    threads: int | None = Field(default=None, ge=1, le=1024)
    """CPU threads for torch and for the BLAS linear layers use (`null`: OMP_NUM_THREADS when set, else half
    the cores, at least one; not every core, whose team stalls whenever a neighbour takes one). A fallback
    engine on CPU beside a primary on CPU gets at most the cores the primary's threads leave, and at least one."""
    cpu_linear: Literal["auto", "torch", "openblas", "onednn"] = "auto"
    """Kernel for float linear layers on CPU: `torch` (F.linear, MKL), `openblas` (float32 through numpy's
    OpenBLAS, up to 2x faster matrix-vector products on non-Intel CPUs), `onednn` (float32 and bfloat16 weights
    packed once at load into oneDNN's blocked layout, as vLLM's CPU build does, so batched decode steps do not
    repack them on every call; a layer's q/k/v and its gate/up projections packed side by side and run as one
    product each, with the same results; the dense copy is released), or `auto` (when the linear weights exceed 64 MiB,
    i.e. decode is bound by memory bandwidth: onednn for bfloat16, openblas for float32 on a non-Intel CPU when
    numpy has it; torch otherwise)."""
    compile: Literal["off", "decode", "steps"] = "off"
    """`decode`: decode steps of `compile_batch_sizes` sequences run a graph compiled at start-up by torch
    inductor (weights frozen into it, products from inductor's C++ GEMM kernels, small ops fused): fastest at a
    few sequences. `steps`: every step of two or more sequences (prefill, decode or mixed) runs one graph compiled
    at start-up with dynamic shapes (weights frozen and packed for oneDNN/MKL, small ops fused): for batches of
    about 8 and more, offline or at high concurrency. Other steps run eagerly, their linears as `cpu_linear` says
    (`onednn`; `torch`; `auto`: oneDNN for bfloat16 weights over 64 MiB, else torch's; not `openblas`). CPU,
    unquantized weights and a C++ compiler only; start-up takes 20-60 s per graph for a 100M-parameter model
    (`steps` compiles two), each graph holds its own copies of the linear weights (`gate plan` counts what
    benchmarks/compile_memory.py measured), and eager steps routed through oneDNN hold one more (packed); `steps`
    also holds a rotary cos/sin table of one row pair per KV slot (counted by `gate plan` too). In
    bfloat16 a graph keeps float32 between the ops it fuses where eager steps round each result to bfloat16, so its
    greedy tokens can differ from the eager steps'. With `steps` a sequence alone runs eagerly and beside others
    through the graph, so its logits differ between the two by float rounding (float32: about 3e-6 on the benchmark
    Llama), which the batching gate sees where it turns a near-tie."""
    compile_batch_sizes: list[int] = Field(default_factory=lambda: [1], min_length=1, max_length=8)
    """Numbers of sequences whose decode steps are compiled (one graph each) when `compile` is `decode`; not read
    by the other modes."""
    decode_attention: Literal["auto", "sdpa", "kernel"] = "auto"
    """How decode rows (one new token each) attend their cached context on the reference backend: `kernel`,
    servegate's decode attention kernel (C, built at first use with the machine's C compiler and kept in
    $SERVEGATE_HOME/kernels: one call per layer for the whole batch, each context read where its KV blocks
    lie); `sdpa`, torch's SDPA, one call per sequence per layer; `auto`, the kernel on CPU for float32 and
    bfloat16 with KV stored in the compute dtype when it builds (a failed build logs why), else SDPA."""
    quantization: Quantization = Field(default_factory=Quantization)
    """Weight quantization."""
    kv_cache: KVCache | None = None
    """Paged KV cache; required by continuous batching."""
    parallelism: Parallelism = Field(default_factory=Parallelism)
    """Tensor, pipeline and data parallelism of an engine deployment (`gate export`); one device when 1."""
    warmup: list[WarmupPrompt] = Field(default_factory=list)
    """Prompts run at start-up with their expected outputs (a broken deploy is caught before traffic)."""

    @model_validator(mode="after")
    def _endpoint_needs_url(self) -> Runtime:
        if self.backend == "endpoint" and not self.endpoint_url:
            raise ValueError("backend: endpoint needs endpoint_url (e.g. http://127.0.0.1:8000/v1)")
        if self.backend in ("vllm", "llamacpp") and self.endpoint_url:
            raise ValueError(f"backend: {self.backend} starts its own server: remove endpoint_url (or use endpoint)")
        for name in ("vllm", "llamacpp"):
            if getattr(self, name) is not None and self.backend != name:
                raise ValueError(f"runtime.{name} configures backend: {name}, but the backend is {self.backend}")
        if self.endpoint_url and not re.match(r"^https?://", self.endpoint_url):
            raise ValueError(f"endpoint_url must start with http:// or https:// (got {self.endpoint_url!r})")
        return self

    @model_validator(mode="after")
    def _cpu_kernels_are_consistent(self) -> Runtime:
        if self.decode_attention == "kernel" and self.device == "cuda":
            raise ValueError("decode_attention: kernel is a CPU kernel: with device: cuda set auto or sdpa")
        if self.decode_attention == "kernel" and self.kv_cache is not None and self.kv_cache.dtype == "fp8":
            raise ValueError("decode_attention: kernel reads KV in the compute dtype, not fp8: set auto or sdpa")
        if any(size < 1 for size in self.compile_batch_sizes):
            raise ValueError(f"compile_batch_sizes must be >= 1 (got {self.compile_batch_sizes})")
        if len(set(self.compile_batch_sizes)) != len(self.compile_batch_sizes):
            raise ValueError(f"compile_batch_sizes lists a size twice (got {self.compile_batch_sizes})")
        if self.compile == "off":
            return self
        if self.cpu_linear == "openblas":
            # OpenBLAS takes torch's threads down to one, and the compiled graphs run on torch's threads
            raise ValueError(
                f"compile: {self.compile} runs its graphs on torch's threads, which cpu_linear: openblas takes down "
                f"to one: choose one (cpu_linear: auto, torch or onednn with compile: {self.compile})"
            )
        if self.quantization.method != "none":
            raise ValueError(
                f"compile: {self.compile} freezes float weights; it does not take quantization "
                f"{self.quantization.method!r}"
            )
        if self.remote:
            raise ValueError(
                f"compile: {self.compile} applies to the reference backend, not to backend: {self.backend}"
            )
        if self.device == "cuda":
            # the compiled graphs' attention op and kernels are CPU ones (runtime/model/compiled_decode.py)
            raise ValueError(
                f"compile: {self.compile} is implemented for CPU only (inductor's C++ kernels); with device: cuda "
                "set compile: off (steps then run eagerly on the GPU)"
            )
        return self


# --- batching --------------------------------------------------------------------------------------


class Batching(Section):
    """How requests are grouped into model steps."""

    mode: Literal["none", "static", "dynamic", "continuous", "offline"] = "none"
    """`none` one at a time; `static` fixed padded batches; `dynamic` request-level batches;
    `continuous` iteration-level with paged KV; `offline` file in, file out at maximum throughput."""
    max_batch_size: int = Field(default=8, ge=1, le=4096)
    """Most sequences in one batch (running sequences, for continuous batching)."""
    max_wait_ms: float = Field(default=10.0, ge=0, le=60_000)
    """How long static and dynamic batching wait to fill a batch, in milliseconds."""
    max_num_batched_tokens: int = Field(default=2048, ge=1, le=10_000_000)
    """Most tokens (prefill + decode) processed in one continuous-batching step."""
    chunked_prefill: bool = False
    """Split long prompts across steps so decodes are not stalled (continuous batching only)."""


# --- postprocess -----------------------------------------------------------------------------------


class ResponseCache(Section):
    """Cache of whole responses for exactly repeated requests."""

    enabled: bool = False
    """Serve exact repeats of a request from the cache."""
    ttl_s: float = Field(default=300.0, gt=0, le=31_536_000)
    """Seconds an entry stays valid."""
    scope: Literal["tenant", "global"] = "tenant"
    """Entries keyed per `tenant` or shared by all (`global`)."""
    max_entries: int = Field(default=10_000, ge=1, le=10_000_000)
    """Most entries kept; the least recently used is evicted first."""


class Postprocess(Section):
    """What the model's tokens become before the client sees them."""

    max_output_tokens: int = Field(default=256, ge=1, le=1_048_576)
    """Most tokens generated for one request (the cap on the request's max_tokens)."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings applied to every request (trimmed from the output)."""
    output_schema: dict[str, Any] | None = None
    """JSON Schema every output must satisfy; checked on every response (and enforced while decoding where
    structured_output.enforce_output_schema says so)."""
    structured_output: StructuredOutput | None = None
    """Constrained decoding of the output constraints requests bring (None: their fields are refused)."""
    tools: ToolCalling | None = None
    """Function calling: requests' tools and tool_choice (None: their fields are refused)."""
    max_output_bytes: int | None = Field(default=None, ge=1, le=1_073_741_824)
    """Most UTF-8 bytes of one answer; a longer answer is an invalid output (failure_policy.on_invalid_output:
    `error` refuses it with invalid_output, `flag` passes it marked invalid). None: no limit but max_output_tokens."""
    logprobs: bool = False
    """Offer log-probabilities of the chosen tokens to clients that ask for them."""
    response_cache: ResponseCache = Field(default_factory=ResponseCache)
    """Whole-response cache."""
    async_result_ttl_s: float = Field(default=600.0, gt=0, le=604_800)
    """Seconds the result of an asynchronous request (Prefer: respond-async) is kept for polling."""

    @field_validator("output_schema")
    @classmethod
    def _valid_output_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_json_schema(value)

    @model_validator(mode="after")
    def _schema_to_enforce(self) -> Postprocess:
        if self.structured_output is not None and self.structured_output.enforce_output_schema:
            if self.output_schema is None:
                raise ValueError("structured_output.enforce_output_schema needs an output_schema to enforce")
        if self.tools is not None and self.output_schema is not None:
            raise ValueError(
                "postprocess.output_schema judges every answer's text, and a tool call is not one: "
                "declare output_schema or tools, not both"
            )
        forced = [m for m in ("required", "named") if self.tools is not None and m in self.tools.tool_choice]
        if forced and self.structured_output is None:
            raise ValueError(
                f"tools.tool_choice {' and '.join(forced)} is decoded under the grammar engine: declare "
                "postprocess.structured_output, or leave those modes out of tools.tool_choice"
            )
        return self

    @field_validator("stop")
    @classmethod
    def _non_empty_stops(cls, value: list[str]) -> list[str]:
        if any(s == "" for s in value):
            raise ValueError("stop strings cannot be empty")
        return value
