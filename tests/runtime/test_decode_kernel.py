"""The decode attention kernel (runtime/model/decode_kernel.py): built once and kept, equal to attention computed
in float64 over each row's own context, the same bits at any batch size, and the runtime's default on CPU."""

from __future__ import annotations

import logging
import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_model_runner import block_tables, random_prompts, run_greedy, tiny_causal_lm

from servegate.contracts.errors import ServegateError
from servegate.contracts.sections import Runtime
from servegate.runtime.model import decode_kernel
from servegate.runtime.model.decode_kernel import KernelUnavailable, load_decode_kernel
from servegate.runtime.model.model_runner import PagedModelRunner
from servegate.runtime.types import SeqChunk


@pytest.fixture
def kernel() -> decode_kernel.DecodeKernel:
    """The kernel as the session builds it (in conftest's SERVEGATE_KERNELS; tests of the build use their own)."""
    return load_decode_kernel()


def reference(q, keys, values, table, lengths, first, block_size, scale, softcap):
    """Attention of each row over its own visible context, gathered slot by slot, in float64."""
    batch, kv_heads, groups, dim = q.shape
    out = torch.empty(q.shape, dtype=torch.float64)
    for b in range(batch):
        slots = [table[b, t // block_size] * block_size + t % block_size for t in range(first[b], lengths[b])]
        k, v = keys[:, slots].double(), values[:, slots].double()  # [Hkv, n, D]
        scores = q[b].double() @ k.transpose(1, 2) * scale  # [Hkv, G, n]
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        out[b] = torch.softmax(scores, dim=-1) @ v
    return out


def random_case(
    seed: int, batch: int, kv_heads: int, groups: int, dim: int, dtype: torch.dtype, window: int | None, block_size=4
):
    """Pools with scattered blocks, ragged contexts (a window cuts the long ones), queries; all random."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    blocks_each = -(-48 // block_size)
    num_blocks = batch * blocks_each + 3
    keys, values = (torch.randn(kv_heads, num_blocks * block_size, dim, generator=gen).to(dtype) for _ in range(2))
    pool = list(range(num_blocks))
    rng.shuffle(pool)
    table = torch.tensor([pool[i * blocks_each : (i + 1) * blocks_each] for i in range(batch)])
    lengths = torch.tensor([rng.randrange(1, 49) for _ in range(batch)])
    first = torch.zeros_like(lengths) if window is None else (lengths - window).clamp(min=0)
    q = torch.randn(batch, kv_heads, groups, dim, generator=gen).to(dtype)
    return q, keys, values, table, lengths, first, block_size


@pytest.mark.parametrize(
    ("dtype", "kv_heads", "groups", "dim", "window", "softcap"),
    [
        (torch.float32, 2, 1, 64, None, None),  # the common shapes run inlined with constant sizes
        (torch.float32, 3, 3, 64, 7, None),  # SmolLM2's grouping (9 query heads over 3), a sliding window
        (torch.float32, 1, 5, 32, None, 30.0),  # a shape no case inlines (the generic task), soft-capped logits
        (torch.bfloat16, 2, 2, 64, None, None),
        (torch.bfloat16, 2, 1, 128, 5, 20.0),
        (torch.bfloat16, 1, 3, 48, None, None),  # an odd number of 16-value chunks: widened, never vdpbf16ps
    ],
)
def test_kernel_equals_attention_over_each_rows_own_context(kernel, dtype, kv_heads, groups, dim, window, softcap):
    q, keys, values, table, lengths, first, block_size = random_case(1, 9, kv_heads, groups, dim, dtype, window)
    scale = dim**-0.5
    got = kernel.attend(q, keys, values, table, lengths, first, block_size, scale, softcap)
    want = reference(q, keys, values, table, lengths, first, block_size, scale, softcap)
    assert got.dtype == dtype and got.shape == q.shape
    tolerance = 2e-6 if dtype == torch.float32 else 1e-2  # bfloat16 output keeps 8 bits of mantissa
    torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_context_length_through_blocks_of_32(kernel, dtype):
    # the kernel sums scores 16 keys at a time, exponentiates 16 at a time and (bfloat16) adds values two rows at
    # a time: lengths 1..48 in blocks of 32 take every whole, partial and odd remainder of those, windowed or not
    q, keys, values, table, _, _, block_size = random_case(4, 48, 3, 3, 64, dtype, None, block_size=32)
    lengths = torch.arange(1, 49)
    for first in (torch.zeros_like(lengths), (lengths - 19).clamp(min=0)):
        got = kernel.attend(q, keys, values, table, lengths, first, block_size, 0.125, None)
        want = reference(q, keys, values, table, lengths, first, block_size, 0.125, None)
        tolerance = 2e-6 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance)


def test_a_table_too_short_for_its_context_or_a_block_outside_the_pool_is_refused_before_a_read(kernel):
    q, keys, values, table, lengths, first, block_size = random_case(5, 4, 2, 1, 64, torch.float32, None)
    with pytest.raises(RuntimeError, match="longer than its block table"):
        kernel.attend(q, keys, values, table[:, :2].contiguous(), lengths.clamp(min=9), first, block_size, 0.125, None)
    table[1, 0] = keys.shape[1] // block_size  # one past the last block
    with pytest.raises(RuntimeError, match="a block id outside the pool"):
        kernel.attend(q, keys, values, table, lengths, first, block_size, 0.125, None)
    with pytest.raises(RuntimeError, match="a row with no visible key"):
        kernel.attend(q, keys, values, table[:, :0].contiguous(), lengths, lengths, block_size, 0.125, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_result_is_the_same_bits_alone_and_among_64(kernel, dtype):
    q, keys, values, table, lengths, first, block_size = random_case(2, 64, 3, 3, 64, dtype, None)
    together = kernel.attend(q, keys, values, table, lengths, first, block_size, 0.125, None)
    torch.set_num_threads(1)  # another thread count must not change a row either
    try:
        for b in (0, 17, 63):
            rows = slice(b, b + 1)
            inputs = (q[rows], keys, values, table[rows], lengths[rows], first[rows])
            alone = kernel.attend(*inputs, block_size, 0.125, None)
            assert torch.equal(alone[0], together[b])
    finally:
        torch.set_num_threads(2)


def test_the_runner_with_the_kernel_decodes_64_sequences_as_sdpa_does(kernel):
    # float32 (the kernel's dtype), GQA, 64 ragged sequences in consecutive and scattered blocks, joining one
    # per step so decode rows share steps with prefill chunks
    torch.manual_seed(0)
    model = tiny_causal_lm("llama", seed=8).float()
    rng = random.Random(8)
    prompts = random_prompts(rng, tuple(rng.randrange(1, 40) for _ in range(64)))
    need = (40 + 5 + 3) // 4
    tables = block_tables(64, need, 64 * need, "consecutive", rng)
    tables = [t if i % 2 == 0 else tuple(reversed(t)) for i, t in enumerate(tables)]  # odd ones: not a run
    plain = PagedModelRunner(model, num_blocks=64 * need, block_size=4)
    with_kernel = PagedModelRunner(model, num_blocks=64 * need, block_size=4, decode_kernel=kernel)
    expected = run_greedy(plain, prompts, 5, tables, chunk=9, join_every=1)
    assert run_greedy(with_kernel, prompts, 5, tables, chunk=9, join_every=1) == expected
    step, _ = with_kernel._prepare([SeqChunk(i, (5,), len(p), tables[i]) for i, p in enumerate(prompts)])
    assert step.kernel_rows is not None and len(step.kernel_rows) == 64 and step.lone_decode is None
    # the logits of a whole decode step agree with SDPA's to float32 rounding
    chunks = [SeqChunk(i, (7,), len(p) + 5, tables[i]) for i, p in enumerate(prompts)]
    torch.testing.assert_close(with_kernel.execute(chunks), plain.execute(chunks), rtol=1e-5, atol=1e-5)


def test_the_library_is_built_once_and_kept(tmp_path, monkeypatch):
    monkeypatch.delenv("SERVEGATE_KERNELS")  # the session's shared folder (conftest): here, the default place
    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path))
    monkeypatch.setattr(decode_kernel, "_LOADED", {})  # loaded from another home by earlier tests
    first = load_decode_kernel()
    assert first.path.is_file() and first.path.is_relative_to(tmp_path / "kernels")
    assert [p.name for p in first.path.parent.iterdir()] == ["decode_attention.so"]  # no scratch left behind
    monkeypatch.setattr(decode_kernel, "_LOADED", {})

    def no_build(*_args):
        raise AssertionError("rebuilt")

    monkeypatch.setattr(decode_kernel, "_build", no_build)
    assert load_decode_kernel().path == first.path


def test_no_compiler_is_one_line_naming_the_way_out(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with pytest.raises(KernelUnavailable, match=r"needs a C compiler .*decode_attention: sdpa"):
        load_decode_kernel()


def test_a_failed_build_says_why_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEGATE_KERNELS", str(tmp_path / "kernels"))
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(decode_kernel, "SOURCE", broken)
    with pytest.raises(KernelUnavailable, match="building the decode attention kernel failed"):
        load_decode_kernel()
    assert not any(p.is_file() for p in (tmp_path / "kernels").rglob("*"))


def test_the_engine_takes_the_kernel_by_default_and_sdpa_when_told(tmp_path, monkeypatch, caplog):
    from servegate.runtime.engine import parts

    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path))
    model = tiny_causal_lm("llama").float()

    def manifest(**runtime: object) -> Any:
        return SimpleNamespace(runtime=Runtime.model_validate({"device": "cpu", **runtime}))

    assert parts._decode_kernel(manifest(), model, 16, "auto") is not None
    assert parts._decode_kernel(manifest(decode_attention="sdpa"), model, 16, "auto") is None
    assert parts._decode_kernel(manifest(), model, 16, "fp8") is None  # fp8 KV: SDPA, quietly
    with pytest.raises(ValueError, match="not fp8"):
        manifest(decode_attention="kernel", kv_cache={"dtype": "fp8"})
    half = tiny_causal_lm("llama").half()
    with pytest.raises(ServegateError, match="decode_attention is kernel, but it takes float32 or bfloat16"):
        parts._decode_kernel(manifest(decode_attention="kernel"), half, 16, "auto")
    monkeypatch.setenv("CC", "no-such-compiler-here")
    monkeypatch.setattr(decode_kernel, "_LOADED", {})
    with caplog.at_level(logging.WARNING, logger="servegate.runtime"):
        assert parts._decode_kernel(manifest(), model, 16, "auto") is None
    assert "runs through SDPA" in caplog.text and "needs a C compiler" in caplog.text


def test_a_kernel_folder_that_cannot_be_made_names_the_variable_to_set(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder\n")  # the tests run as root: a file, not a read-only folder, is what stops them
    monkeypatch.setenv("SERVEGATE_KERNELS", str(blocked))
    monkeypatch.setattr(decode_kernel, "_LOADED", {})
    with pytest.raises(KernelUnavailable, match="set SERVEGATE_KERNELS .* to a writable folder"):
        load_decode_kernel()
