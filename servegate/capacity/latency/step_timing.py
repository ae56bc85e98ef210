"""Profiling stage 1's data: the grid of hand-built steps to time on the model runner, and timing them."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from servegate.capacity.latency.terms import Chunk, StepSample

PROFILE_BATCH = 64
"""Largest batch the step grid measures (the planner searches up to this)."""
MIN_PROMPT_TOKENS = 2
"""Shortest prefill timed (a chunk of one token is a decode)."""
MIN_DECODE_CONTEXT = 16
"""Shortest context a decode is timed at; the others are a quarter, half and all of runtime.max_model_len."""
CHUNKED_PREFILLS = 3
"""About this many of the grid's prompt lengths are also timed continuing after as many cached tokens."""

Tick = Callable[[], None]


@dataclass(frozen=True)
class ProfileLimits:
    """The largest steps worth measuring for a manifest."""

    max_prompt_tokens: int
    """Longest prompt (preprocess.max_input_tokens, within the pool)."""
    max_batch_size: int
    """Most sequences in a step."""
    max_num_batched_tokens: int
    """Most tokens in a step."""
    max_context: int
    """Longest sequence (runtime.max_model_len)."""


def _geometric(lo: int, hi: int) -> list[int]:
    out, x = [], max(1, lo)
    while x < hi:
        out.append(x)
        x *= 2
    out.append(hi)
    return sorted(set(out))


def step_grid(limits: ProfileLimits, num_blocks: int, block_size: int) -> list[tuple[Chunk, ...]]:
    """The steps to time: prefills, batched prefills, decodes at several contexts, and mixes; all fit the pool."""
    cap_tokens = num_blocks * block_size
    max_prompt = max(MIN_PROMPT_TOKENS, min(limits.max_prompt_tokens, limits.max_num_batched_tokens, cap_tokens))
    grid: list[tuple[Chunk, ...]] = []
    prompts = _geometric(MIN_PROMPT_TOKENS, max_prompt)
    grid += [((n, 0),) for n in prompts]
    for n in prompts[:: max(1, len(prompts) // CHUNKED_PREFILLS)]:  # a prefill after cached tokens (chunked prefill)
        if 2 * n <= min(limits.max_context, cap_tokens):
            grid.append(((n, n),))
    batches = _geometric(1, max(1, limits.max_batch_size))
    for b in batches[1:]:
        n = min(prompts[len(prompts) // 2], limits.max_num_batched_tokens // b, (num_blocks // b) * block_size)
        if n >= MIN_PROMPT_TOKENS:
            grid.append(tuple((n, 0) for _ in range(b)))
    contexts = sorted(
        {MIN_DECODE_CONTEXT, *(max(MIN_DECODE_CONTEXT, limits.max_context // d) for d in (4, 2)), limits.max_context}
    )
    for b in batches:
        for ctx in contexts:
            if b * (-(-ctx // block_size)) <= num_blocks:
                grid.append(tuple((1, ctx - 1) for _ in range(b)))
    for b in batches:  # decodes beside one prefill
        ctx, n = contexts[1], prompts[len(prompts) // 2]
        if (b + 1) * (-(-max(ctx, n) // block_size)) <= num_blocks and n + b <= limits.max_num_batched_tokens:
            grid.append(((n, 0), *((1, ctx - 1) for _ in range(b))))
    return grid


def time_steps(
    runner: Any, grid: Sequence[tuple[Chunk, ...]], repeats: int = 5, tick: Tick | None = None
) -> list[StepSample]:
    """Execute every step of `grid` on the runner `repeats` times (after one warm-up); median seconds each."""
    from servegate.runtime.types import SeqChunk

    bs, nb = runner.block_size, runner.num_blocks
    vocab = max(2, int(runner.vocab_size))
    rng = np.random.default_rng(0)
    sync = _synchronizer(runner)
    samples: list[StepSample] = []
    for chunks in grid:
        inputs = []
        next_block = 0
        for seq_id, (n, start) in enumerate(chunks):
            blocks = -(-(start + n) // bs)
            table = tuple((next_block + i) % nb for i in range(blocks))
            next_block += blocks
            ids = tuple(int(t) for t in rng.integers(4, vocab, size=n))
            inputs.append(SeqChunk(seq_id, ids, start, table))
        runner.execute(inputs)
        sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            runner.execute(inputs)
            sync()
            times.append(time.perf_counter() - t0)
        samples.append(StepSample(tuple(chunks), statistics.median(times)))
        if tick:
            tick()
    return samples


def _synchronizer(runner: Any) -> Callable[[], None]:
    device = getattr(runner, "device", None)
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        import torch

        return torch.cuda.synchronize
    return lambda: None
