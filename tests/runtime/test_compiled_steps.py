"""runtime.compile: steps: one dynamic-shape graph runs every step of two or more sequences (prefill, decode and
mixed steps of any size) with the model's own greedy tokens, never recompiling after start-up.

Compiling the two shape classes takes ~20-40 s even for the tiny model, so one module-scoped runner serves the
behaviour tests. Its eager steps (one sequence) go through oneDNN, routed after the compile as the engine does.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch
from pydantic import ValidationError
from test_compiled_decode import compiled_runner, needs_compiler
from test_model_runner import block_tables, random_prompts, reference_greedy, run_greedy, tiny_causal_lm

from servegate.contracts.sections import Runtime
from servegate.runtime.model.compiled_steps import MIN_SEQS, CompiledSteps
from servegate.runtime.model.model_runner import PagedModelRunner, SeqChunk
from servegate.runtime.model.rotary_table import RotaryTable


@pytest.fixture(scope="module")
def compiled() -> Iterator[tuple[torch.nn.Module, PagedModelRunner]]:
    yield from compiled_runner(96, compile_steps=True)


@needs_compiler
def test_start_up_compiles_both_shape_classes(compiled) -> None:
    model, runner = compiled
    assert isinstance(runner.compiled, CompiledSteps) and runner.compiled.warm
    assert runner.compiled.wants(MIN_SEQS, 7) and runner.compiled.wants(9, 9)
    assert not runner.compiled.wants(1, 1) and not runner.compiled.wants(1, 12)
    # the graph gathers rotary cos/sin from a table of every slot's position; the eager model keeps its module
    rotary = runner.compiled._forward._orig_mod.model.rotary_emb
    assert isinstance(rotary, RotaryTable) and rotary.cos.shape[0] == runner.num_blocks * runner.block_size
    assert not isinstance(model.model.rotary_emb, RotaryTable)


@needs_compiler
def test_every_step_of_two_or_more_sequences_runs_the_graph_with_the_models_greedy_tokens(compiled) -> None:
    model, runner = compiled
    rng = random.Random(7)
    prompts = random_prompts(rng, (5, 12, 9, 3, 16, 7))
    expected = [reference_greedy(model, p, 8) for p in prompts]
    before, fallbacks = dict(runner.compiled.runs), runner.compiled.fallbacks
    # sequences join one per step: prefill chunks beside decode rows (mixed steps), then decode steps of 2..6
    out = run_greedy(runner, prompts, 8, block_tables(6, 7, 96, "scattered", rng), chunk=5, join_every=1)
    assert out == expected
    grown = {size: runner.compiled.runs.get(size, 0) - before.get(size, 0) for size in range(1, 7)}
    assert grown[1] == 0  # the first sequence's own first step runs eagerly
    assert all(grown[size] >= 1 for size in range(2, 7)), grown
    assert runner.compiled.fallbacks == fallbacks, "a step recompiled instead of reusing the start-up graphs"


@needs_compiler
def test_one_sequence_runs_eagerly_and_agrees(compiled) -> None:
    model, runner = compiled
    rng = random.Random(8)
    prompt = random_prompts(rng, (11,))
    before = dict(runner.compiled.runs)
    assert run_greedy(runner, prompt, 6, block_tables(1, 5, 96, "consecutive", rng)) == [
        reference_greedy(model, prompt[0], 6)
    ]
    assert runner.compiled.runs == before


@needs_compiler
def test_a_batch_of_thirty_two_decodes_through_the_graph(compiled) -> None:
    model, runner = compiled
    rng = random.Random(9)
    prompts = random_prompts(rng, tuple(rng.randrange(2, 9) for _ in range(32)))
    expected = [reference_greedy(model, p, 4) for p in prompts]
    fallbacks = runner.compiled.fallbacks
    # all prefilled in one step, then decoding together
    assert run_greedy(runner, prompts, 4, block_tables(32, 3, 96, "scattered", rng), join_every=0) == expected
    assert runner.compiled.runs[32] >= 4 and runner.compiled.fallbacks == fallbacks


@needs_compiler
def test_sibling_products_run_as_one_product_in_the_graph(compiled) -> None:
    """q/k/v and gate/up read the same input: the graph concatenates each group into one packed product, so a
    Llama layer runs 4 products (qkv, o, gate_up, down) rather than 7, plus the LM head once."""
    model, runner = compiled
    with torch.profiler.profile() as prof:
        runner.execute([SeqChunk(0, (1, 2, 3), 0, (0,)), SeqChunk(1, (4, 5), 0, (1,))])
    products = [
        e
        for e in prof.events()
        if e.name in ("mkldnn::_linear_pointwise", "mkl::_mkl_linear", "aten::addmm", "aten::mm")
    ]
    assert len(products) == 4 * model.config.num_hidden_layers + 1, [e.name for e in products]


@needs_compiler  # the block check comes after the compiler check
def test_the_two_compile_modes_are_exclusive_and_steps_need_blocks() -> None:
    model = tiny_causal_lm("llama").float()
    with pytest.raises(ValueError, match="choose one"):
        PagedModelRunner(model, num_blocks=8, block_size=4, compile_batch_sizes=(1,), compile_steps=True)
    with pytest.raises(ValueError, match="needs 4 KV blocks"):
        PagedModelRunner(model, num_blocks=3, block_size=1, compile_steps=True)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"compile": "steps", "cpu_linear": "openblas"}, "compile: steps runs its graphs on torch's threads"),
        ({"compile": "steps", "quantization": {"method": "int4-weight"}}, "steps freezes float weights"),
        ({"compile": "steps", "backend": "endpoint", "endpoint_url": "http://x:1/v1"}, "reference backend"),
        ({"compile": "steps", "device": "cuda"}, "compile: steps is implemented for CPU only"),
    ],
)
def test_the_manifest_refuses_steps_where_it_cannot_run(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Runtime.model_validate(fields)
