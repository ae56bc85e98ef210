"""PagedModelRunner: greedy decoding through paged KV equals the model's own `generate`, token for token.

Random tiny models of several architectures in float64 (so near-ties cannot flip an argmax), driven by
a small scheduler written here: staggered arrivals, chunked prefill, mixed prefill/decode steps, blocks
handed out consecutively or scattered, and prompts whose prefix KV sits in another sequence's blocks.
"""

from __future__ import annotations

import random

import pytest
import torch
import transformers as hf

from servegate.runtime.model import batched_decode
from servegate.runtime.model.kv_memory import num_kv_blocks
from servegate.runtime.model.model_runner import PagedModelRunner
from servegate.runtime.model.paged_attention import ContextSource, PagedKVCache, PagedStep, SeqAttention
from servegate.runtime.types import SeqChunk

VOCAB = 101


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from threads; on a shared CPU, extra threads stall every op."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_causal_lm(arch: str, seed: int = 0, **overrides: object) -> torch.nn.Module:
    """A random 2-layer model of `arch` in float64 (GQA: 4 query heads over 2 KV heads where supported)."""
    config_cls, model_cls = {
        "llama": (hf.LlamaConfig, hf.LlamaForCausalLM),
        "qwen2": (hf.Qwen2Config, hf.Qwen2ForCausalLM),
        "mistral": (hf.MistralConfig, hf.MistralForCausalLM),
        "gemma": (hf.GemmaConfig, hf.GemmaForCausalLM),
        "gemma2": (hf.Gemma2Config, hf.Gemma2ForCausalLM),
        "phi3": (hf.Phi3Config, hf.Phi3ForCausalLM),
        "gpt_neox": (hf.GPTNeoXConfig, hf.GPTNeoXForCausalLM),
    }[arch]
    config: dict[str, object] = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch != "gpt_neox":
        config["num_key_value_heads"] = 2
    if arch.startswith("gemma"):
        config["head_dim"] = 16
    config.update(overrides)
    torch.manual_seed(seed)
    return model_cls(config_cls(**config)).to(torch.float64).eval()


def reference_greedy(model: torch.nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    """The model's own greedy continuation (EOS ignored so every output has new_tokens tokens)."""
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


def block_tables(count: int, blocks_each: int, num_blocks: int, layout: str, rng: random.Random) -> list[tuple]:
    """Per-sequence block tables: `consecutive` runs, or `scattered` (shuffled pool)."""
    pool = list(range(num_blocks))
    if layout == "scattered":
        rng.shuffle(pool)
    return [tuple(pool[i * blocks_each : (i + 1) * blocks_each]) for i in range(count)]


def run_greedy(
    runner: PagedModelRunner,
    prompts: list[list[int]],
    new_tokens: int,
    tables: list[tuple],
    *,
    chunk: int = 7,
    join_every: int = 1,
    cached: list[int] | None = None,
) -> list[list[int]]:
    """Greedy decode every prompt through the runner; sequence i joins at step i * join_every.

    Prompts are prefilled `chunk` tokens per step, alongside the decodes of earlier sequences.
    `cached[i]` prompt tokens of sequence i are already in its blocks (prefix-cache hits).
    """
    done = list(cached) if cached is not None else [0] * len(prompts)
    outputs: list[list[int]] = [[] for _ in prompts]
    step = 0
    while any(len(o) < new_tokens for o in outputs):
        chunks = []
        for i, prompt in enumerate(prompts):
            if i * join_every > step or len(outputs[i]) >= new_tokens:
                continue
            tokens = prompt[done[i] : done[i] + chunk] if done[i] < len(prompt) else outputs[i][-1:]
            chunks.append(SeqChunk(i, tuple(tokens), done[i], tables[i]))
        logits = runner.execute(chunks)
        assert logits.dtype == torch.float32 and logits.shape == (len(chunks), runner.vocab_size)
        for row, c in enumerate(chunks):
            done[c.seq_id] += len(c.token_ids)
            if done[c.seq_id] >= len(prompts[c.seq_id]):
                outputs[c.seq_id].append(int(logits[row].argmax()))
        step += 1
    return outputs


def random_prompts(rng: random.Random, lengths: tuple[int, ...]) -> list[list[int]]:
    """Prompts of random token ids (3..VOCAB-1: no pad/bos/eos)."""
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("layout", ["consecutive", "scattered"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gemma", "phi3", "gpt_neox"])
def test_greedy_matches_generate(arch: str, layout: str) -> None:
    model = tiny_causal_lm(arch)
    rng = random.Random(hash((arch, layout)) % 1000)
    prompts = random_prompts(rng, (1, 4, 9, 16, 23))
    expected = [reference_greedy(model, p, 10) for p in prompts]
    runner = PagedModelRunner(model, num_blocks=48, block_size=4)
    tables = block_tables(len(prompts), 9, 48, layout, rng)
    assert run_greedy(runner, prompts, 10, tables) == expected


def test_whole_batch_at_once_and_one_token_prefill_chunks() -> None:
    model = tiny_causal_lm("llama", seed=3)
    rng = random.Random(3)
    prompts = random_prompts(rng, (5, 12, 2, 17))
    expected = [reference_greedy(model, p, 8) for p in prompts]
    runner = PagedModelRunner(model, num_blocks=64, block_size=8)
    tables = block_tables(len(prompts), 4, 64, "scattered", rng)
    assert run_greedy(runner, prompts, 8, tables, chunk=64, join_every=0) == expected
    runner = PagedModelRunner(model, num_blocks=64, block_size=8)
    assert run_greedy(runner, prompts, 8, tables, chunk=1, join_every=2) == expected


def test_multi_query_attention_matches_generate() -> None:
    model = tiny_causal_lm("llama", seed=5, num_key_value_heads=1)
    rng = random.Random(5)
    prompts = random_prompts(rng, (6, 11))
    expected = [reference_greedy(model, p, 8) for p in prompts]
    runner = PagedModelRunner(model, num_blocks=16, block_size=4)
    assert run_greedy(runner, prompts, 8, block_tables(2, 8, 16, "scattered", rng)) == expected


@pytest.mark.parametrize("batched", [False, True], ids=["per-sequence", "batched"])
def test_64_sequences_decoded_together_give_each_ones_own_tokens(
    monkeypatch: pytest.MonkeyPatch, batched: bool
) -> None:
    # 64 decoding sequences share every step, with contexts of different lengths, some in consecutive blocks and
    # some scattered; batched: attended in one call per layer over a padded batch. Each row sees only its own
    model = tiny_causal_lm("llama", seed=8)
    rng = random.Random(8)
    lengths = tuple(rng.randrange(1, 40) for _ in range(64))
    prompts = random_prompts(rng, lengths)
    new_tokens = 5
    need = (max(lengths) + new_tokens + 3) // 4
    consecutive = block_tables(64, need, 64 * need, "consecutive", rng)
    scattered = block_tables(64, need, 64 * need, "scattered", rng)
    # even sequences read in place-able runs of blocks, odd ones scattered blocks (from their own pool half)
    tables = [consecutive[i] if i % 2 == 0 else tuple(b + 64 * need for b in scattered[i]) for i in range(64)]
    expected = [reference_greedy(model, p, new_tokens) for p in prompts]
    alone = [
        run_greedy(PagedModelRunner(model, num_blocks=need, block_size=4), [p], new_tokens, [tuple(range(need))])[0]
        for p in prompts
    ]
    assert alone == expected
    runner = PagedModelRunner(model, num_blocks=128 * need, block_size=4, batched_decode=batched)
    assert run_greedy(runner, prompts, new_tokens, tables, chunk=64, join_every=0) == expected
    # staggered: decode rows share steps with prefill chunks (the batched rows are not the whole step)
    assert run_greedy(runner, prompts, new_tokens, tables, chunk=9, join_every=1) == expected
    if not batched:
        return
    # a workspace too small for all 64 contexts: the rows are attended in several batches
    monkeypatch.setattr(batched_decode, "WORKSPACE_BYTES", 100_000)
    step, _ = runner._prepare([SeqChunk(i, (5,), len(p), tables[i]) for i, p in enumerate(prompts)])
    assert len(step.decode_batches) > 4 and sum(len(b) for b in step.decode_batches) == 64
    assert run_greedy(runner, prompts, new_tokens, tables, chunk=64, join_every=0) == expected
    assert run_greedy(runner, prompts, new_tokens, tables, chunk=9, join_every=1) == expected


def test_batched_decode_equals_per_sequence_decode_with_fp8_kv_and_a_window() -> None:
    model = tiny_causal_lm("mistral", seed=9, sliding_window=6)
    rng = random.Random(9)
    prompts = random_prompts(rng, (3, 17, 8, 12))
    tables = block_tables(4, 6, 24, "scattered", rng)
    logits = []
    for batched in (True, False):
        runner = PagedModelRunner(model, num_blocks=24, block_size=4, kv_dtype="fp8", batched_decode=batched)
        runner.execute([SeqChunk(i, tuple(p), 0, tables[i]) for i, p in enumerate(prompts)])
        chunks = [SeqChunk(i, (5 + i,), len(p), tables[i]) for i, p in enumerate(prompts)]
        logits.append(runner.execute(chunks))
    assert torch.allclose(logits[0], logits[1], rtol=0, atol=1e-6)


def test_prompt_whose_prefix_kv_is_in_another_sequences_blocks() -> None:
    model = tiny_causal_lm("qwen2", seed=1)
    rng = random.Random(11)
    shared = random_prompts(rng, (8,))[0]  # two full blocks of 4
    first = shared + random_prompts(rng, (3,))[0]
    second = shared + random_prompts(rng, (5,))[0]
    runner = PagedModelRunner(model, num_blocks=32, block_size=4)
    first_table = (20, 5, 9, 30, 12)
    # the first sequence computes the shared prefix into blocks 20 and 5
    assert run_greedy(runner, [first], 6, [first_table]) == [reference_greedy(model, first, 6)]
    # the second reuses those two blocks: it starts at position 8 and feeds only its own suffix
    second_table = (20, 5, 17, 3, 25)
    got = run_greedy(runner, [second], 6, [second_table], chunk=2, cached=[8])
    assert got == [reference_greedy(model, second, 6)]


def test_sliding_window_attention_matches_generate() -> None:
    model = tiny_causal_lm("mistral", seed=2, sliding_window=5)
    rng = random.Random(2)
    prompts = random_prompts(rng, (3, 14, 9))
    expected = [reference_greedy(model, p, 9) for p in prompts]
    for layout in ("consecutive", "scattered"):
        runner = PagedModelRunner(model, num_blocks=32, block_size=4)
        assert run_greedy(runner, prompts, 9, block_tables(3, 7, 32, layout, rng), chunk=4) == expected


def test_lone_decoding_sequence_matches_generate_past_its_window() -> None:
    # one sequence over consecutive blocks decodes through the batch-1 fast path, here with GQA and a window
    model = tiny_causal_lm("mistral", seed=3, sliding_window=5, num_key_value_heads=2)
    prompt = random_prompts(random.Random(3), (6,))[0]
    runner = PagedModelRunner(model, num_blocks=16, block_size=4)
    assert run_greedy(runner, [prompt], 12, [tuple(range(2, 7))]) == [reference_greedy(model, prompt, 12)]


@pytest.mark.parametrize("window", [None, 3])
def test_lone_decode_fast_path_equals_the_general_path(window: int | None) -> None:
    heads, kv_heads, dim, length = 4, 2, 8, 11
    cache = PagedKVCache(
        num_layers=1, num_blocks=8, block_size=4, kv_heads=kv_heads, head_dim=dim, dtype=torch.float32, device="cpu"
    )
    gen = torch.Generator().manual_seed(0)
    for pool in (cache.keys[0], cache.values[0]):
        pool.copy_(torch.randn(pool.shape, generator=gen))
    query, key, value = (torch.randn(1, h, 1, dim, generator=gen) for h in (heads, kv_heads, kv_heads))
    source = ContextSource(length=length, run_start=8, blocks=None)
    step = PagedStep(cache, torch.tensor([8 + length - 1]), [SeqAttention(0, 1, length - 1, source)])
    assert step.lone_decode == (8, length)
    fast = step.attend(0, query, key, value, 0.3, window, None)
    step.lone_decode = None
    general = step.attend(0, query, key, value, 0.3, window, None)
    assert fast.shape == (1, 1, heads, dim)
    assert torch.equal(fast, general)


def test_kv_of_the_wrong_head_count_is_refused_naming_the_mismatch() -> None:
    cache = PagedKVCache(
        num_layers=1, num_blocks=4, block_size=4, kv_heads=2, head_dim=8, dtype=torch.float32, device="cpu"
    )
    source = ContextSource(length=3, run_start=0, blocks=None)
    step = PagedStep(cache, torch.tensor([2]), [SeqAttention(0, 1, 2, source)])
    query, kv = torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 1, 8)  # 4 KV heads where the pool holds 2
    with pytest.raises(ValueError, match="the config's head counts do not match the model"):
        step.attend(0, query, kv, kv, None, None, None)


def test_softcapped_alternating_sliding_layers_match_generate() -> None:
    # Gemma 2: attention logit soft-capping, and every other layer a sliding window
    model = tiny_causal_lm("gemma2", seed=4, sliding_window=6)
    rng = random.Random(4)
    prompts = random_prompts(rng, (4, 13))
    expected = [reference_greedy(model, p, 8) for p in prompts]
    runner = PagedModelRunner(model, num_blocks=16, block_size=4)
    assert run_greedy(runner, prompts, 8, block_tables(2, 6, 16, "scattered", rng), chunk=5) == expected


def test_generate_still_works_on_a_model_the_runner_uses() -> None:
    model = tiny_causal_lm("llama", seed=6)
    prompt = random_prompts(random.Random(6), (7,))[0]
    padded = torch.tensor([[0, 0, 0] + prompt[:4], prompt])  # left-padded batch: the mask matters
    mask = (padded != 0).long()
    with torch.inference_mode():
        before = reference_greedy(model, prompt, 6), model(padded, attention_mask=mask).logits
    PagedModelRunner(model, num_blocks=8, block_size=4)
    assert model.config._attn_implementation == "servegate_paged"
    with torch.inference_mode():
        after = reference_greedy(model, prompt, 6), model(padded, attention_mask=mask).logits
    assert after[0] == before[0]
    assert torch.allclose(after[1][:, 3:], before[1][:, 3:])


def test_fp8_kv_cache_stores_one_byte_per_element_and_stays_close() -> None:
    model = tiny_causal_lm("llama", seed=7).to(torch.float32)
    exact = PagedModelRunner(model, num_blocks=8, block_size=4)
    fp8 = PagedModelRunner(model, num_blocks=8, block_size=4, kv_dtype="fp8")
    assert fp8.cache.keys[0].element_size() == 1
    assert fp8.bytes_per_token() * 4 == exact.bytes_per_token()  # float32 -> 1 byte
    assert fp8.cache.nbytes() * 4 == exact.cache.nbytes()
    prompt = tuple(random_prompts(random.Random(7), (10,))[0])
    table = (3, 1, 6)
    steps = [SeqChunk(0, prompt[:6], 0, table), SeqChunk(0, prompt[6:], 6, table), SeqChunk(0, (9,), 10, table)]
    for chunk in steps:
        a, b = exact.execute([chunk])[0], fp8.execute([chunk])[0]
        assert not torch.equal(a, b)  # the KV really was rounded
        assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.99


def test_from_budget_uses_the_shared_block_arithmetic() -> None:
    model = tiny_causal_lm("qwen2")  # 2 layers x 2 KV heads x head_dim 16, float64
    runner = PagedModelRunner.from_budget(model, 1_000_000, block_size=16)
    assert runner.bytes_per_token() == 2 * 2 * 2 * 16 * 8
    assert runner.num_blocks == num_kv_blocks(1_000_000, 16, runner.bytes_per_token()) == 61
    assert PagedModelRunner.from_budget(model, 1_000_000, 16, kv_dtype="fp8").num_blocks == 488
    with pytest.raises(ValueError, match="memory_budget"):
        PagedModelRunner.from_budget(model, 1000, block_size=16)


def test_runner_describes_its_model() -> None:
    model = tiny_causal_lm("phi3")
    runner = PagedModelRunner(model, num_blocks=4, block_size=8)
    assert (runner.vocab_size, runner.block_size, runner.num_blocks) == (VOCAB, 8, 4)
    assert runner.eos_token_ids == frozenset({2})


def test_bad_chunks_are_refused_with_the_reason() -> None:
    runner = PagedModelRunner(tiny_causal_lm("llama"), num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="cannot hold positions up to 6"):
        runner.execute([SeqChunk(3, (5, 6, 7, 8, 9, 10), 0, (0,))])
    with pytest.raises(ValueError, match="block id outside"):
        runner.execute([SeqChunk(3, (5, 6), 0, (7,))])
    with pytest.raises(ValueError, match="vocabulary"):
        runner.execute([SeqChunk(3, (5, VOCAB), 0, (0,))])
    assert runner.execute([]).shape == (0, VOCAB)
