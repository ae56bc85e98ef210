"""What the reference engine is made of, built from a manifest: model runner, tokenizer, scheduler, caches.

Parts given explicitly (a toy runner in tests, a preloaded model in benchmarks) are used as they are;
everything else is loaded from the manifest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.contract_layer import contract_parts
from servegate.runtime.engine.part_types import Embedder, Sampler
from servegate.runtime.postprocess import Detokenizer, OutputValidator
from servegate.runtime.response_cache import ResponseCache
from servegate.runtime.scheduling import Scheduler, SchedulerConfig, make_scheduler
from servegate.runtime.scheduling.kv_blocks import KVBlockManager, pool_size
from servegate.runtime.types import ModelRunner, PromptEncoder

if TYPE_CHECKING:
    from servegate.runtime.model.decode_kernel import DecodeKernel
    from servegate.runtime.model.grammar_mask import GrammarMask
    from servegate.runtime.model.quantization import QuantizationReport

log = logging.getLogger("servegate.runtime")


@dataclass
class EngineParts:
    """Everything a running reference engine uses."""

    runner: ModelRunner | None
    """The paged model runner (None for task: embed)."""
    tokenizer: Detokenizer | None
    """Decodes output tokens (the model's tokenizer; None for task: embed)."""
    preprocessor: PromptEncoder | None
    """Turns requests into prompt tokens (preprocess.Preprocessor; None for task: embed)."""
    sampler: Sampler
    scheduler: Scheduler | None
    """The batching mode's scheduler over the runner's KV pool (None for task: embed)."""
    validator: OutputValidator | None
    """output_schema checker, when the manifest declares one."""
    response_cache: ResponseCache | None
    embedder: Embedder | None = None
    """EmbeddingModel for task: embed."""
    device: Any = "cpu"
    """torch.device the runner computes on (a generator for seeded sampling lives there)."""
    quantization: QuantizationReport | None = None
    """What quantization did, when the manifest quantizes the model."""
    grammar: GrammarMask | None = None
    model: Any = None
    """The causal LM the runner runs, for prompt scoring (None for a runner given without one, or task: embed)."""
    """Compiles and enforces output constraints, when the manifest declares postprocess.structured_output."""


def build_parts(
    served: ServedModel,
    *,
    runner: ModelRunner | None = None,
    tokenizer: Detokenizer | None = None,
    preprocessor: PromptEncoder | None = None,
    sampler: Sampler | None = None,
    model: Any = None,
) -> EngineParts:
    """Load (or take) the model, size the KV pool, and assemble scheduler, caches and validators."""
    if served.preprocess.task == "embed":
        from servegate.runtime.model.embedding import EmbeddingModel

        return EngineParts(
            None,
            tokenizer,
            preprocessor,
            sampler or _default_sampler(),
            None,
            None,
            None,  # embeddings are not cached: an embedding is cheap next to a generation
            embedder=EmbeddingModel(served),
        )
    report = None
    if runner is None:
        runner, tokenizer, report, model = _load_runner(served, model, tokenizer)
    contract = contract_parts(served, tokenizer, preprocessor)  # the same pieces the endpoint engine uses
    kv = served.runtime.kv_cache
    block_manager = KVBlockManager(
        runner.num_blocks, runner.block_size, prefix_caching=kv is not None and kv.prefix_caching
    )
    scheduler = make_scheduler(served.batching.mode, SchedulerConfig.from_manifest(served), block_manager)
    return EngineParts(
        runner=runner,
        tokenizer=tokenizer,
        preprocessor=contract.preprocessor,
        sampler=sampler or _default_sampler(),
        scheduler=scheduler,
        validator=contract.validator,
        response_cache=contract.response_cache,
        device=getattr(runner, "device", "cpu"),
        quantization=report,
        model=model,
        grammar=_grammar_mask(served, tokenizer, runner),
    )


def _grammar_mask(served: ServedModel, tokenizer: Any, runner: ModelRunner) -> GrammarMask | None:
    """The grammar engine over the model's tokenizer (built at start: it reads the whole vocabulary once)."""
    if served.postprocess.structured_output is None:
        return None
    from servegate.runtime.model.grammar_mask import GrammarMask

    return GrammarMask(tokenizer, sorted(runner.eos_token_ids))


def _load_runner(
    served: ServedModel, model: Any, tokenizer: Detokenizer | None
) -> tuple[ModelRunner, Detokenizer | None, QuantizationReport | None, Any]:
    """The paged runner over the manifest's weights (quantized as declared), the tokenizer, the quantization
    report and the model."""
    from servegate.runtime.model.cpu_linear import apply_cpu_linear, use_torch_threads
    from servegate.runtime.model.kv_memory import kv_dims_from_config
    from servegate.runtime.model.model_runner import PagedModelRunner

    report = None
    if model is None:
        from servegate.runtime.model.weights import load_causal_lm

        loaded = load_causal_lm(served)
        model, tokenizer = loaded.model, tokenizer or loaded.tokenizer
        if served.runtime.quantization.method != "none":
            from servegate.runtime.model.quantization import quantize_model

            report = quantize_model(model, served.runtime.quantization)
    else:  # load_causal_lm set torch's threads on this thread, the one that runs the steps; a given model too
        use_torch_threads(served.runtime.threads)
    runtime = served.runtime
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    compute_dtype = str(model.dtype).removeprefix("torch.")  # the first floating parameter's dtype
    dims = kv_dims_from_config(config)
    num_blocks, block_size = pool_size(served, dims, compute_dtype)
    kv = runtime.kv_cache
    kv_dtype = "fp8" if kv is not None and kv.dtype == "fp8" else "auto"
    runner = PagedModelRunner(
        model,
        num_blocks=num_blocks,
        block_size=block_size,
        kv_dtype=kv_dtype,
        compile_batch_sizes=runtime.compile_batch_sizes if runtime.compile == "decode" else (),
        compile_steps=runtime.compile == "steps",
        decode_kernel=_decode_kernel(served, model, dims.head_dim, kv_dtype),
    )
    # routed once the runner is built and after quantization (quantized weights keep their own kernels): compiled
    # graphs were built over their own view of the weights (compiled_decode.compile_view), so routing reaches only
    # the steps they do not cover (prefills, other batch sizes)
    compiled = runtime.compile != "off"
    routed = apply_cpu_linear(model, runtime.cpu_linear, runtime.threads, compiled=compiled)
    if compiled and routed:
        log.info("runtime.cpu_linear: %d linear layers of the eager steps routed through oneDNN", routed)
    return runner, tokenizer, report, model


def _decode_kernel(served: ServedModel, model: Any, head_dim: int, kv_dtype: str) -> DecodeKernel | None:
    """The decode attention kernel `runtime.decode_attention` asks for: None for `sdpa`, and for `auto` where it
    cannot serve this model (another device or dtype, fp8 KV) or cannot be built here (said once in the log)."""
    from servegate.runtime.model.decode_kernel import KernelUnavailable, kernel_takes, load_decode_kernel

    wanted = served.runtime.decode_attention
    if wanted == "sdpa":
        return None
    device, dtype = next(model.parameters()).device, model.dtype
    why_not = None
    if kv_dtype == "fp8":
        why_not = "the KV cache is stored as fp8"
    elif not kernel_takes(dtype, device, head_dim):
        why_not = f"it takes float32 or bfloat16 on CPU with head_dim a multiple of 16 ({dtype}, {device}, {head_dim})"
    if why_not is not None:  # a model the kernel does not take: SDPA, as declared by `auto`
        if wanted == "kernel":
            raise ServegateError(f"runtime.decode_attention is kernel, but {why_not}: set auto or sdpa")
        return None
    try:
        return load_decode_kernel()
    except KernelUnavailable as exc:
        if wanted == "kernel":
            raise
        log.warning("runtime.decode_attention auto: decode attention runs through SDPA: %s", exc)
        return None


def _default_sampler() -> Sampler:
    from servegate.runtime.model.sampling import sample_batch

    return sample_batch
