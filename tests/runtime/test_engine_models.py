"""Every batching mode's greedy output equals the model's own unbatched `generate`, token for token.

Random tiny float64 models of four architectures (float64: no near-tie flips between the batched,
paged computation and the reference), 32+ requests of mixed prompt and output lengths, including forced
preemption (a pool of a few blocks), prefix-cache hits and chunked prefill.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
import transformers
from runtime_factories import ToyPreprocessor, ToyTokenizer, toy_manifest

from servegate.runtime.engine.reference import ReferenceEngine
from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams

model_runner = pytest.importorskip("servegate.runtime.model.model_runner")

VOCAB, EOS, MAX_LEN, BLOCK = 96, 2, 96, 4
ARCHS = {
    "llama": transformers.LlamaConfig,
    "qwen2": transformers.Qwen2Config,
    "mistral": transformers.MistralConfig,
    "qwen3": transformers.Qwen3Config,
}


def tiny_model(arch: str) -> Any:
    """A random 2-layer model with grouped-query attention, in float64."""
    torch.manual_seed(0)
    config = ARCHS[arch](
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=EOS,
        bos_token_id=1,
        pad_token_id=0,
    )
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float64)
    return model.eval()


def requests(n: int, seed: int, shared_prefix: list[int] | None = None) -> list[GenerationRequest]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = list(shared_prefix or []) + [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 30))]
        out.append(
            GenerationRequest(f"r{i}", prompt_token_ids=prompt, params=SamplingParams(max_tokens=rng.randint(1, 16)))
        )
    return out


def reference(model: Any, request: GenerationRequest) -> list[int]:
    """The model's own greedy generate, one request at a time (no padding)."""
    ids = torch.tensor([request.prompt_token_ids])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=request.params.max_tokens,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=0,
        )
    return out[0, ids.shape[1] :].tolist()


def greedy(logits: torch.Tensor, params: list[SamplingParams], generators: list[Any]) -> tuple[Any, Any]:
    chosen = logits.argmax(-1)
    return chosen, torch.log_softmax(logits, -1).gather(1, chosen[:, None])[:, 0]


def sampler() -> Any:
    try:
        from servegate.runtime.model.sampling import sample_batch
    except ImportError:
        return greedy
    return sample_batch


SETUPS = {
    "none": ({"batching": {"mode": "none"}, "runtime": {"kv_cache": None}}, 64),
    "static": (
        {"batching": {"mode": "static", "max_batch_size": 6, "max_wait_ms": 1}, "runtime": {"kv_cache": None}},
        200,
    ),
    "dynamic": (
        {"batching": {"mode": "dynamic", "max_batch_size": 6, "max_wait_ms": 1}, "runtime": {"kv_cache": None}},
        200,
    ),
    "continuous": ({"batching": {"mode": "continuous", "max_batch_size": 8}}, 200),
    "offline": ({"batching": {"mode": "offline", "max_batch_size": 8}}, 200),
    "preemption": ({"batching": {"mode": "continuous", "max_batch_size": 8}}, MAX_LEN // BLOCK + 3),
    "chunked": ({"batching": {"mode": "continuous", "max_num_batched_tokens": 8, "chunked_prefill": True}}, 200),
    "prefix": (
        {"runtime": {"kv_cache": {"block_size": BLOCK, "memory_budget": "1MiB", "prefix_caching": True}}},
        200,
    ),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Any:
    """Tiny models run fastest on one thread (and do not fight the other tests for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=list(ARCHS))
def arch_case(request: pytest.FixtureRequest, one_thread: None) -> dict[str, Any]:
    """A model and its reference outputs on 32 requests behind a shared 20-token prefix."""
    model = tiny_model(request.param)
    reqs = requests(32, seed=1, shared_prefix=list(range(10, 30)))
    return {"model": model, "requests": reqs, "expected": [reference(model, r) for r in reqs]}


@pytest.fixture(scope="module", params=["openblas", "onednn"])
def routed_case(request: pytest.FixtureRequest, one_thread: None) -> dict[str, Any]:
    """The Llama case with its linear layers routed through OpenBLAS or through oneDNN's packed weights
    (`runtime.cpu_linear: openblas` / `onednn`)."""
    from servegate.runtime.model.cpu_linear import numpy_blas, route_linears
    from servegate.runtime.model.fused_linear import route_linears_onednn
    from servegate.runtime.model.onednn_linear import onednn_available

    if request.param == "openblas" and numpy_blas() != "openblas":
        pytest.skip("numpy is not built on OpenBLAS")
    if request.param == "onednn" and not onednn_available():
        pytest.skip("torch has no oneDNN")
    model = tiny_model("llama")
    if request.param == "onednn":  # oneDNN packs float32 and bfloat16, not the float64 of the other cases
        model = model.float()
    route = route_linears if request.param == "openblas" else route_linears_onednn
    assert route(model) == 2 * 7 + 1
    reqs = requests(32, seed=1, shared_prefix=list(range(10, 30)))
    return {"model": model, "requests": reqs, "expected": [reference(model, r) for r in reqs]}


@pytest.mark.parametrize("setup", list(SETUPS))
def test_greedy_outputs_equal_model_generate(arch_case: dict[str, Any], setup: str) -> None:
    check_setup(arch_case, setup)


@pytest.mark.parametrize("setup", list(SETUPS))
def test_greedy_outputs_equal_model_generate_with_routed_linears(routed_case: dict[str, Any], setup: str) -> None:
    check_setup(routed_case, setup)


def check_setup(arch_case: dict[str, Any], setup: str) -> None:
    """Run the case's requests through the engine set up as `setup`; outputs must equal the references."""
    sections, num_blocks = SETUPS[setup]
    sections = {"preprocess": {"max_input_tokens": 64}, **sections}
    sections["runtime"] = {"max_model_len": MAX_LEN, **sections.get("runtime", {})}
    served = toy_manifest(**sections)
    runner = model_runner.PagedModelRunner(arch_case["model"], num_blocks=num_blocks, block_size=BLOCK)
    engine = ReferenceEngine(
        served,
        runner=runner,
        tokenizer=ToyTokenizer(),
        preprocessor=ToyPreprocessor(vocab_size=VOCAB),
        sampler=sampler(),
    )
    reqs, expected = arch_case["requests"], arch_case["expected"]
    try:
        results = engine.generate(reqs)
        stats = engine.stats()
    finally:
        engine.shutdown_sync()
    got = [list(r.token_ids) if isinstance(r, FinishEvent) else r.error.message for r in results]
    assert got == expected
    if setup == "preemption":
        assert stats.preemptions > 0
    if setup == "prefix":
        # 20 shared tokens = 5 full blocks; the first step's prompts are computed together and cannot hit
        assert stats.prefix_cache_hits >= (32 - 8) * 5
    assert stats.kv_blocks_used == 0


def test_continuous_batching_reads_every_context_in_place(
    arch_case: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room in the pool, the block manager lays each sequence's blocks out consecutively while 8 of them
    grow in turn, so no decode step gathers a context block by block (the cost it saves: benchmarks/README.md)."""
    from servegate.runtime.model.paged_attention import PagedKVCache

    gathers: list[int] = []
    original = PagedKVCache.gather

    def counted(self: PagedKVCache, layer: int, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gathers.append(blocks.numel())
        return original(self, layer, blocks)

    monkeypatch.setattr(PagedKVCache, "gather", counted)
    check_setup(arch_case, "continuous")  # outputs still equal model.generate's
    assert gathers == []
