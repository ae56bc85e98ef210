"""A fake engine endpoint with known step costs: continuous batching over an OpenAI-compatible API.

Requests join servegate's own continuous scheduler (max_batch_size sequences, max_num_batched_tokens per
step); each step lasts step_s + prefill_token_s per prompt token + decode_seq_s per decoding sequence (times
a log-normal jitter when `jitter` > 0), on absolute deadlines so sleeps do not drift, and streams one token
to every sequence it advanced. What a black-box profile should recover from outside, it declares here.
A prompt counts one token per `chars_per_token` characters (the bench's prompts without a tokenizer), or
one per id when the prompt is a list of token ids.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass
from typing import Any

from servegate.runtime.scheduling import SchedulerConfig, Sequence, make_scheduler
from servegate.runtime.scheduling.kv_blocks import KVBlockManager
from support.synthetic_server import SyntheticServer


@dataclass(frozen=True)
class StepCosts:
    """What one engine step costs and how the engine batches."""

    step_s: float = 0.004
    """Fixed cost of every step."""
    prefill_token_s: float = 0.0001
    """Per prompt token computed in the step."""
    decode_seq_s: float = 0.001
    """Per sequence decoding one token in the step."""
    request_s: float = 0.0
    """From a request being read to it reaching the scheduler (tokenization, hand-off)."""
    jitter: float = 0.0
    """Coefficient of variation of a step's log-normal slowdown (0: exact)."""
    max_batch_size: int = 8
    max_num_batched_tokens: int = 512
    chars_per_token: float = 4.0
    seed: int = 0

    def step_seconds(self, chunks: list[tuple[int, int]]) -> float:
        """Seconds of a step of (new tokens, cached tokens) chunks, before jitter."""
        prefill = sum(n for n, _ in chunks if n > 1)
        decodes = sum(1 for n, _ in chunks if n == 1)
        return self.step_s + self.prefill_token_s * prefill + self.decode_seq_s * decodes


class StepCostServer(SyntheticServer):
    """`with StepCostServer(StepCosts(...)) as server: server.url`; steps and streams in a background thread."""

    def __init__(self, costs: StepCosts, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host=host, port=port)
        self.costs = costs
        self.steps: list[tuple[float, float, int]] = []
        """(began, ended, sequences) of every step (perf_counter seconds)."""
        self._streams: dict[int, asyncio.Queue[int | None]] = {}
        self._arrived: list[Sequence] = []
        self._wake: asyncio.Event | None = None
        self._next_id = 0

    def _prompt_tokens(self, prompt: Any) -> int:
        if isinstance(prompt, list):
            return max(1, len(prompt))
        return max(1, round(len(str(prompt)) / self.costs.chars_per_token))

    async def _respond(self, request: dict, received: float, writer: asyncio.StreamWriter) -> None:
        assert self._wake is not None
        n_prompt = self._prompt_tokens(request.get("prompt", ""))
        n_out = int(request.get("max_tokens", 16))
        if self.costs.request_s:
            await asyncio.sleep(max(0.0, received + self.costs.request_s - time.perf_counter()))
        seq_id, self._next_id = self._next_id, self._next_id + 1
        stream: asyncio.Queue[int | None] = asyncio.Queue()
        self._streams[seq_id] = stream
        self._arrived.append(Sequence(seq_id, [7] * n_prompt, n_out, arrival_time=time.perf_counter()))
        self._wake.set()
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
            b"connection: keep-alive\r\n\r\n"
        )
        sent = 0
        while (token := await stream.get()) is not None:
            sent += token
            self._chunk(writer, {"choices": [{"index": 0, "text": "x", "finish_reason": None}]})
            await writer.drain()
        usage = {"prompt_tokens": n_prompt, "completion_tokens": sent}
        self._chunk(writer, {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage})
        payload = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload))
        await writer.drain()

    async def _engine(self) -> None:
        c = self.costs
        config = SchedulerConfig(c.max_batch_size, 0.0, c.max_num_batched_tokens, False)
        scheduler = make_scheduler("continuous", config, KVBlockManager(1 << 16, 16))
        rng = random.Random(c.seed)
        sigma = math.sqrt(math.log1p(c.jitter**2)) if c.jitter > 0 else 0.0
        assert self._wake is not None
        clock = time.perf_counter()
        while True:
            for seq in self._arrived:
                scheduler.add(seq)
            self._arrived.clear()
            plan = scheduler.schedule(time.perf_counter())
            if plan.is_empty:
                self._wake.clear()
                await self._wake.wait()
                clock = time.perf_counter()  # idle until now: the next step starts when work arrived
                continue
            duration = c.step_seconds([(ch.num_tokens, ch.start_pos) for ch in plan.chunks])
            if sigma:
                duration *= math.exp(rng.gauss(0.0, sigma) - sigma * sigma / 2)
            # absolute deadlines: a late wake-up does not delay the steps after it (unless over 2 ms behind)
            began = max(clock, time.perf_counter() - 0.002)
            clock = began + duration
            await asyncio.sleep(max(0.0, clock - time.perf_counter()))
            self.steps.append((began, clock, len(plan.chunks)))
            for seq in scheduler.update(plan, {ch.seq_id: 0 for ch in plan.chunks if ch.samples}):
                stream = self._streams[seq.seq_id]
                stream.put_nowait(1)
                if len(seq.output_token_ids) >= seq.max_tokens:
                    scheduler.finish(seq)
                    stream.put_nowait(None)
                    del self._streams[seq.seq_id]

    async def _main(self) -> None:
        self._wake = asyncio.Event()
        engine = asyncio.create_task(self._engine())
        try:
            await super()._main()
        finally:
            engine.cancel()
