"""The manifest as `llama-server` arguments: what each field becomes, and what llama.cpp cannot express.

One mapping for both uses: `runtime.backend: llamacpp` starts the server with these arguments, and `gate export
--target llamacpp` writes them as a command line. A field llama.cpp would serve differently than declared (a
batching mode it lacks, a load-time quantization, a context past the GGUF's trained length, weights that are not
GGUF) is a `behaviour_change` residual, which the backend and `gate validate` turn into an error naming it.

Server-wide sampling defaults are set neutral (repeat penalty 1.0, top-k and min-p off, top-p 1.0): llama.cpp's
own (1.1 in some builds, 40, 0.05, 0.95) would make `temperature: 0` requests other than greedy and sampled ones
other than declared, and a request sent to the exported server directly (not through servegate) gets them too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servegate.contracts.manifest import ServedModel
from servegate.runtime.remote.gguf_header import GgufHeader
from servegate.runtime.remote.vllm_args import EngineArgs

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
"""KV cache types `--cache-type-k/-v` accept (llama.cpp 0.3.36's vendored build)."""
DEFAULT_UBATCH = 512
"""llama.cpp's default physical micro-batch, tokens."""
NEUTRAL_SAMPLING: dict[str, Any] = {"repeat_penalty": 1.0, "top_k": 0, "min_p": 0.0, "top_p": 1.0}
"""Sampling settings that leave the distribution as the model gives it, by their request and /props names; the
server-wide flags are the same names with dashes (`--repeat-penalty`)."""
_ELEMENT_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0}


def command_line(binary: str, args: dict[str, Any]) -> list[str]:
    """`binary` followed by the arguments: `True` is a bare flag, anything else `--name value`."""
    cmd = [binary]
    for key, value in args.items():
        if value is True:
            cmd.append(f"--{key}")
        elif value is not False and value is not None:
            cmd += [f"--{key}", str(value)]
    return cmd


def slot_count(served: ServedModel) -> int:
    """llama-server's slots (`--parallel`): batching.max_batch_size, or one without batching."""
    return 1 if served.batching.mode == "none" else served.batching.max_batch_size


def context_tokens(served: ServedModel) -> int:
    """Tokens of KV llama-server allocates at start (`--ctx-size`): max_model_len for every slot, up front."""
    return served.runtime.max_model_len * slot_count(served)


def _weights(served: ServedModel, out: EngineArgs, model: str, header: GgufHeader | None) -> None:
    weights = served.weights
    if weights.format != "gguf":
        out.change(
            "weights.format",
            weights.format,
            "llama.cpp serves GGUF files only: convert the checkpoint (convert_hf_to_gguf.py, then llama-quantize) "
            "and declare weights.format: gguf with its gguf_file",
        )
    out.put("weights.source", "model", model)
    if header is not None and header.file_type:
        out.residual(
            "weights.gguf_file",
            header.file_type,
            "nowhere",
            f"llama.cpp runs the {header.file_type} tensors as stored; the reference runtime dequantizes them "
            "(the engine-fidelity comparison `gate check` makes)",
        )
    if weights.dtype not in ("auto", "float32"):
        out.change(
            "weights.dtype",
            weights.dtype,
            "llama.cpp runs the GGUF's own tensor types; it cannot load them as another float type",
        )
    if weights.sha256:
        out.residual(
            "weights.sha256",
            dict(sorted(weights.sha256.items())),
            "checksum_file",
            "llama-server loads the file without checking its digest",
        )


def _context(served: ServedModel, out: EngineArgs, header: GgufHeader | None) -> None:
    """Each slot gets max_model_len tokens: `--ctx-size` is their sum, split evenly (no unified KV pool)."""
    length = served.runtime.max_model_len
    out.put("runtime.max_model_len", "ctx-size", context_tokens(served))
    out.put("runtime.max_model_len", "no-kv-unified", True)
    if header is not None and header.context_length is not None and length > header.context_length:
        out.change(
            "runtime.max_model_len",
            length,
            f"past the {header.context_length} tokens {header.path.name} was trained with "
            f"({header.architecture}.context_length): llama.cpp would stretch the positions past what the model saw",
        )


def _kv_cache(served: ServedModel, out: EngineArgs, header: GgufHeader | None) -> None:
    kv, dtype = served.runtime.kv_cache, served.runtime.dtype
    cache_type = "f16" if dtype in ("float16", "bfloat16") else "f32"
    if kv is not None and kv.dtype == "fp8":
        out.change(
            "runtime.kv_cache.dtype", "fp8", f"llama.cpp has no fp8 KV cache (its types: {', '.join(CACHE_TYPES)})"
        )
    field = "runtime.kv_cache.dtype" if kv is not None else "runtime.dtype"
    out.put(field, "cache-type-k", cache_type)
    out.put(field, "cache-type-v", cache_type)
    if kv is None:
        out.residual("runtime.kv_cache", None, "nowhere", "llama-server allocates KV for --ctx-size tokens up front")
        out.put("runtime.kv_cache", "cache-ram", 0)
        out.put("runtime.kv_cache", "no-cache-prompt", True)
        return
    out.residual(
        "runtime.kv_cache.block_size",
        kv.block_size,
        "nowhere",
        "llama.cpp's KV cache holds one cell per token, not pages of blocks",
    )
    need = header.kv_bytes(context_tokens(served), _ELEMENT_BYTES[cache_type]) if header else None
    if need is not None and need > int(kv.memory_budget):
        out.change(
            "runtime.kv_cache.memory_budget",
            int(kv.memory_budget),
            f"llama-server allocates KV for max_model_len x slots tokens up front: {need} bytes in {cache_type}, "
            "over the budget (lower max_model_len or batching.max_batch_size, or raise the budget)",
        )
    else:
        how = f"{need} bytes for every slot's full context" if need is not None else "sized from --ctx-size"
        out.residual(
            "runtime.kv_cache.memory_budget",
            int(kv.memory_budget),
            "nowhere",
            f"llama-server allocates its KV cache up front: {how}",
        )
    if not kv.prefix_caching:
        # no request starts from the previous request's KV, nor from a copy kept beyond the slots
        out.put("runtime.kv_cache.prefix_caching", "no-cache-prompt", True)
        out.put("runtime.kv_cache.prefix_caching", "cache-ram", 0)
        return
    settings = served.runtime.llamacpp
    if settings is not None and settings.cache_reuse:
        out.put("runtime.llamacpp.cache_reuse", "cache-reuse", settings.cache_reuse)
    if kv.cache_scope == "tenant":
        out.change(
            "runtime.kv_cache.cache_scope",
            "tenant",
            "llama.cpp's prompt cache belongs to a slot and is reused by whichever request the slot serves next, "
            "whatever its tenant: declare cache_scope: global, or prefix_caching: false (servegate then sends "
            "cache_prompt: false with every request)",
        )


def _batching(served: ServedModel, out: EngineArgs) -> None:
    """The slots (`--parallel`) and step sizes."""
    bat = served.batching
    if bat.mode in ("static", "dynamic", "offline"):
        out.change(
            "batching.mode",
            bat.mode,
            f"llama-server batches continuously (slots join and leave between steps); {bat.mode} batching is "
            "not available: declare batching.mode continuous (or none for one slot)",
        )
    out.put("batching.max_batch_size" if bat.mode != "none" else "batching.mode", "parallel", slot_count(served))
    out.put("batching.mode", "cont-batching" if bat.mode != "none" else "no-cont-batching", True)
    out.put("batching.max_num_batched_tokens", "batch-size", bat.max_num_batched_tokens)
    settings = served.runtime.llamacpp
    ubatch = settings.ubatch_size if settings is not None and settings.ubatch_size else None
    field = "runtime.llamacpp.ubatch_size" if ubatch else "batching.max_num_batched_tokens"
    out.put(field, "ubatch-size", min(ubatch or DEFAULT_UBATCH, bat.max_num_batched_tokens))
    if bat.mode == "continuous" and not bat.chunked_prefill:
        out.residual(
            "batching.chunked_prefill",
            False,
            "nowhere",
            "llama-server fills each step's batch with prompt pieces: a prompt larger than what is left "
            "of the batch is split across steps (scheduling only)",
        )


def _runtime(served: ServedModel, out: EngineArgs, device: str) -> None:
    rt = served.runtime
    out.put("runtime.seed", "seed", rt.seed)
    if rt.threads is not None:
        out.put("runtime.threads", "threads", rt.threads)
        out.put("runtime.threads", "threads-batch", rt.threads)
    else:
        out.residual("runtime.threads", None, "nowhere", "llama.cpp picks its own thread count")
    if device == "cpu":
        out.put("runtime.device", "n-gpu-layers", 0)
    elif device == "cuda":
        out.put("runtime.device", "n-gpu-layers", 999)
    else:
        out.residual("runtime.device", "auto", "nowhere", "the llama-server build decides where layers run")
    if rt.dtype in ("float16", "bfloat16"):
        out.change(
            "runtime.dtype",
            rt.dtype,
            "llama.cpp computes on the GGUF's tensor types with float32 "
            "accumulation on CPU; it has no 16-bit compute setting: declare runtime.dtype float32",
        )
    out.residual(
        "runtime.dtype",
        rt.dtype,
        "nowhere",
        "llama.cpp multiplies quantized weights against activations "
        "quantized to 8 bits (its dot-product kernels): logprobs differ slightly from the dequantized reference",
    )
    if rt.quantization.method != "none":
        out.change(
            "runtime.quantization.method",
            rt.quantization.method,
            "llama.cpp does not quantize at load: the GGUF's tensor types are its quantization (make the file "
            "with llama-quantize and gate that)",
        )
    par = rt.parallelism
    if par.tensor_parallel_size > 1 or par.pipeline_parallel_size > 1:
        out.change("runtime.parallelism", par.model_dump(), "llama-server runs one copy on one device here")
    if par.data_parallel_size > 1:
        out.residual(
            "runtime.parallelism.data_parallel_size",
            par.data_parallel_size,
            "nowhere",
            "run that many llama-server replicas",
        )
    if rt.cpu_linear != "auto":
        out.residual("runtime.cpu_linear", rt.cpu_linear, "nowhere", "llama.cpp runs its own (ggml) CPU kernels")
    if rt.decode_attention != "auto":
        out.residual("runtime.decode_attention", rt.decode_attention, "nowhere", "llama.cpp runs its own attention")
    if rt.warmup:
        out.residual(
            "runtime.warmup",
            [w.prompt for w in rt.warmup],
            "readiness_probe",
            "llama-server reports healthy once loaded; the probe compares the greedy outputs",
        )


def _preprocess(served: ServedModel, out: EngineArgs, header: GgufHeader | None) -> None:
    pre = served.preprocess
    if pre.task == "embed":
        out.change("preprocess.task", "embed", "the llama.cpp backend serves generation only")
    template = pre.chat_template
    if template == "none":
        out.residual(
            "preprocess.chat_template",
            "none",
            "gateway",
            "llama-server's own chat route would apply the GGUF's template; servegate joins the messages",
        )
        return
    out.put("preprocess.chat_template", "jinja", True)
    if template != "tokenizer":
        out.put("preprocess.chat_template", "chat-template-file", str(served.resolve_path(template)))
    elif header is not None and not header.chat_template:
        out.residual(
            "preprocess.chat_template",
            "tokenizer",
            "gateway",
            f"{header.path.name} carries no chat template: llama-server's chat route falls back to its own",
        )


def _postprocess(served: ServedModel, out: EngineArgs) -> None:
    structured = served.postprocess.structured_output
    if structured is None:
        return
    lacking = [kind for kind in structured.kinds if kind in ("regex", "grammar")]
    if lacking:
        out.change(
            "postprocess.structured_output.kinds",
            lacking,
            "llama.cpp has no regex constraint, and its grammars are GBNF, not servegate's: list only "
            "json_object, json_schema and choice",
        )
    if structured.whitespace == "compact":
        out.change(
            "postprocess.structured_output.whitespace",
            "compact",
            "llama.cpp's grammar for a JSON Schema allows whitespace between tokens: declare whitespace: any",
        )
    out.residual(
        "postprocess.structured_output.backend",
        structured.backend,
        "gateway",
        "llama.cpp masks with its own GBNF grammar made from each request's JSON Schema; servegate checks "
        "every output against the schema after",
    )


def server_args(
    served: ServedModel, model: str | Path, header: GgufHeader | None = None, *, device: str | None = None
) -> EngineArgs:
    """The llama-server arguments for a manifest (long names without dashes), with the residuals.

    `model`: the .gguf path the server reads; `header`: that file's header (trained context, KV shape), None
    when the file is not at hand (an export for another machine); `device`: where the server runs.
    """
    device = device or served.runtime.device
    out = EngineArgs()
    out.put("name", "alias", served.runtime.endpoint_model or served.name)
    _weights(served, out, str(model), header)
    _batching(served, out)
    _context(served, out, header)
    _kv_cache(served, out, header)
    _runtime(served, out, device)
    _preprocess(served, out, header)
    _postprocess(served, out)
    for key, value in NEUTRAL_SAMPLING.items():  # requests through servegate send them too
        out.args[key.replace("_", "-")] = value
    out.args.update({"metrics": True, "slots": True, "no-webui": True})
    return out
