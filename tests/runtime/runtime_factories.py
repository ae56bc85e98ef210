"""Factories for runtime tests that need no model: sequences, schedulers, and a toy paged "model".

The toy runner keeps token ids in its paged pool where a real model keeps K/V, and derives each next
token from the tokens it reads back through the block table. A scheduler or block manager that hands
out a wrong table, overwrites a shared block or forgets a position therefore changes the output, just
as it would with a real model; `toy_generate` gives the unbatched reference.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from support.manifests import served_model

from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.reference import ReferenceEngine
from servegate.runtime.engine.step_trace import StepTrace
from servegate.runtime.scheduling import SchedulerConfig, SchedulerOutput, make_scheduler
from servegate.runtime.scheduling import Sequence as Seq
from servegate.runtime.scheduling.base import Scheduler
from servegate.runtime.scheduling.kv_blocks import KVBlockManager
from servegate.runtime.types import GenerationRequest, SamplingParams, SeqChunk

TOY_VOCAB = 64
TOY_EOS = 2


def toy_logits(tokens: Sequence[int], vocab: int = TOY_VOCAB) -> np.ndarray:
    """Float32 logits [vocab] that depend on every token of the context (deterministic)."""
    digest = hashlib.blake2b(np.asarray(tokens, dtype=np.int64).tobytes(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little")).standard_normal(vocab).astype(np.float32)


def toy_generate(prompt: Sequence[int], max_tokens: int, eos: int | None = TOY_EOS) -> list[int]:
    """Greedy reference output of the toy model, one sequence at a time with no cache."""
    tokens, out = list(prompt), []
    while len(out) < max_tokens:
        token = int(np.argmax(toy_logits(tokens)))
        out.append(token)
        tokens.append(token)
        if token == eos:
            break
    return out


class ToyRunner:
    """A ModelRunner whose "KV cache" is the token ids themselves, stored in a paged pool."""

    def __init__(self, num_blocks: int, block_size: int, vocab_size: int = TOY_VOCAB, eos: int | None = TOY_EOS):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset() if eos is None else frozenset({eos})
        self.pool = np.full(num_blocks * block_size, -1, dtype=np.int64)
        self.steps: list[list[SeqChunk]] = []

    def _slot(self, table: Sequence[int], pos: int) -> int:
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        """Write each chunk's tokens into its slots, then read the context back: logits [len(chunks), vocab]."""
        self.steps.append(list(chunks))
        rows = []
        for chunk in chunks:
            end = chunk.start_pos + len(chunk.token_ids)
            assert len(chunk.block_table) * self.block_size >= end, "block table too short"
            for offset, token in enumerate(chunk.token_ids):
                self.pool[self._slot(chunk.block_table, chunk.start_pos + offset)] = token
            context = [int(self.pool[self._slot(chunk.block_table, p)]) for p in range(end)]
            assert -1 not in context, f"sequence {chunk.seq_id} reads a position nobody wrote"
            rows.append(toy_logits(context, self.vocab_size))
        return torch.from_numpy(np.stack(rows)) if rows else torch.empty(0, self.vocab_size)


class ToyTokenizer:
    """Decodes toy ids to text: ids 0-3 are special (2 is EOS), others map to one or two letters."""

    eos_token_id = TOY_EOS
    all_special_ids = [0, 1, 2, 3]

    def __len__(self) -> int:
        """The vocabulary's size, as a Hugging Face tokenizer reports it (token ids are checked against it)."""
        return TOY_VOCAB

    def piece(self, token: int) -> str:
        """The text of one id."""
        letter = "abcdefghijklmnopqrstuvwxyz"[token % 26]
        return letter * (1 + token % 2)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Concatenate the pieces, skipping special ids."""
        return "".join(self.piece(i) for i in ids if not (skip_special_tokens and i in self.all_special_ids))

    def encode(self, text: str) -> list[int]:
        """Letters back to ids (one id per letter; enough for tests that send text)."""
        return [4 + (ord(c) - 97 - 4) % 26 * 2 if c.isalpha() else 5 for c in text.lower()]


def create_sequences(
    n: int,
    *,
    prompt_lens: tuple[int, int] = (3, 40),
    max_tokens: tuple[int, int] = (1, 24),
    seed: int = 0,
    shared_prefix: Sequence[int] = (),
    salt: str = "",
    start_id: int = 0,
) -> list[Seq]:
    """n sequences of random prompts (optionally behind a shared prefix) and output lengths."""
    rng = random.Random(seed)
    seqs = []
    for i in range(n):
        prompt = list(shared_prefix) + [rng.randrange(4, TOY_VOCAB) for _ in range(rng.randint(*prompt_lens))]
        seqs.append(
            Seq(
                start_id + i,
                prompt,
                rng.randint(*max_tokens),
                arrival_time=i * 1e-6,
                cache_salt=salt,
                request_id=f"r{i}",
            )
        )
    return seqs


def create_scheduler(
    mode: str = "continuous",
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    max_batch_size: int = 8,
    max_num_batched_tokens: int = 64,
    chunked_prefill: bool = False,
    max_wait_s: float = 0.0,
    prefix_caching: bool = False,
) -> Scheduler:
    """A scheduler over a fresh block manager, as a manifest would configure it."""
    config = SchedulerConfig(
        max_batch_size=max_batch_size,
        max_wait_s=max_wait_s,
        max_num_batched_tokens=max_num_batched_tokens,
        chunked_prefill=chunked_prefill,
    )
    return make_scheduler(mode, config, KVBlockManager(num_blocks, block_size, prefix_caching=prefix_caching))


def drive(
    scheduler: Scheduler,
    seqs: Sequence[Seq],
    runner: ToyRunner | None = None,
    *,
    eos: int | None = TOY_EOS,
    dt: float = 1.0,
    max_steps: int = 100_000,
) -> tuple[dict[int, list[int]], list[SchedulerOutput]]:
    """Run sequences to completion as the engine would (greedy); returns outputs by seq_id and every plan."""
    bm = scheduler.block_manager
    runner = runner or ToyRunner(bm.num_blocks, bm.block_size, eos=eos)
    for seq in seqs:
        scheduler.add(seq)
    plans: list[SchedulerOutput] = []
    now = 0.0
    for _ in range(max_steps):
        if not scheduler.has_unfinished():
            break
        plan = scheduler.schedule(now)
        plans.append(plan)
        logits = runner.execute(plan.model_inputs)
        sampled = {c.seq_id: int(logits[i].argmax()) for i, c in enumerate(plan.chunks) if c.samples}
        for seq in scheduler.update(plan, sampled):
            if len(seq.output_token_ids) >= seq.max_tokens or seq.output_token_ids[-1] == eos:
                scheduler.finish(seq)
        now += dt
    else:
        raise AssertionError("sequences did not finish")
    return {s.seq_id: list(s.output_token_ids) for s in seqs}, plans


def reference_outputs(seqs: Sequence[Seq], eos: int | None = TOY_EOS) -> dict[int, list[int]]:
    """The toy model's unbatched greedy outputs."""
    return {s.seq_id: toy_generate(s.prompt_token_ids, s.max_tokens, eos) for s in seqs}


# --- engine factories ------------------------------------------------------------------------------


class ToyPreprocessor:
    """Token ids as given, or the toy tokenizer's ids of the prompt text (no truncation)."""

    def __init__(self, tokenizer: ToyTokenizer | None = None, vocab_size: int | None = None) -> None:
        self.tokenizer = tokenizer or ToyTokenizer()
        # the model's vocabulary where a test's model has more ids than the toy tokenizer names (admission checks
        # prompt ids against it, as the real Preprocessor checks them against its tokenizer's)
        self.vocab_size = vocab_size or len(self.tokenizer)

    def encode(self, request: GenerationRequest) -> EncodedPrompt:
        """The request's prompt ids."""
        if request.prompt_token_ids is not None:
            return EncodedPrompt(list(request.prompt_token_ids), 0)
        text = request.prompt if request.prompt is not None else " ".join(m["content"] for m in request.messages or [])
        return EncodedPrompt(self.tokenizer.encode(text), 0)


@dataclass
class EncodedPrompt:
    """What a preprocessor returns."""

    token_ids: list[int]
    truncated_tokens: int


def toy_sampler(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]):
    """Greedy at temperature 0, else a temperature-scaled draw from the request's generator."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    tokens = []
    for row, p, g in zip(logprobs, params, generators, strict=True):
        if p.temperature == 0:
            tokens.append(int(row.argmax()))
        else:
            tokens.append(int(torch.multinomial(torch.softmax(row / p.temperature, -1), 1, generator=g)))
    chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)]
    return torch.tensor(tokens), chosen


class GatedRunner(ToyRunner):
    """A toy runner that can be held inside execute() (to fill queues) or made to fail."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_next = 0
        self.delay_s = 0.0

    def execute(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        """Wait for the gate, optionally raise, then behave like the toy runner."""
        self.entered.set()
        self.gate.wait(timeout=30)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("injected model failure")
        return super().execute(chunks)


def toy_manifest(**sections: Any) -> ServedModel:
    """A small valid manifest; `sections` are merged over its defaults (dicts per section)."""
    data: dict[str, Any] = {
        "name": "toy",
        "weights": {"source": "zoo:tiny-primary"},
        "preprocess": {"max_input_tokens": 96},
        "postprocess": {"max_output_tokens": 32},
        "runtime": {"max_model_len": 128, "kv_cache": {"block_size": 4, "memory_budget": "1MiB"}},
        "batching": {"mode": "continuous", "max_batch_size": 8, "max_num_batched_tokens": 128},
    }
    return served_model(data, **sections)


def toy_engine(
    served: ServedModel | None = None,
    *,
    num_blocks: int = 256,
    runner: ToyRunner | None = None,
    fallback=None,
    step_trace: StepTrace | None = None,
) -> ReferenceEngine:
    """A started reference engine over the toy runner (block size from the manifest)."""
    served = served or toy_manifest()
    kv = served.runtime.kv_cache
    block_size = kv.block_size if kv is not None else 16
    engine = ReferenceEngine(
        served,
        fallback=fallback,
        step_trace=step_trace,
        runner=runner or GatedRunner(num_blocks, block_size),
        tokenizer=ToyTokenizer(),
        preprocessor=ToyPreprocessor(),
        sampler=toy_sampler,
    )
    engine.start_sync()  # starts the fallback engine too
    return engine


def token_requests(seqs: Sequence[Seq], **params: Any) -> list[GenerationRequest]:
    """Requests carrying the sequences' prompts as token ids and their max_tokens."""
    return [
        GenerationRequest(
            id=f"r{s.seq_id}",
            prompt_token_ids=list(s.prompt_token_ids),
            params=SamplingParams(max_tokens=s.max_tokens, **params),
        )
        for s in seqs
    ]
