"""A deterministic test double of the engine that solves the zoo tasks, with faults that can be planted.

The "model" answers arith, recall and json prompts exactly from the text it is given (so truncation
that drops a recall code really loses the answer), one character per token plus <bos>. The manifest's
quantization degrades it the way a real low-bit model does (int2/int3 get most answers wrong, int8
none), and the manifest's truncation, output cap, caches, deadline, queue and fallback are applied as
the runtime applies them. Faults: a tenant-blind cache, outputs that depend on batch position or on what
else is in flight, a wrong first streamed token, a miscounted usage, JSON that breaks above a concurrency.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servegate.contracts.errors import ServingError
from servegate.contracts.loading import load_fallback
from servegate.contracts.manifest import ServedModel
from servegate.gates.result import GateReport, GateResult
from servegate.runtime.types import (
    EngineStats,
    ErrorEvent,
    Event,
    FinishEvent,
    GenerationRequest,
    Result,
    TokenEvent,
    Usage,
)
from support.fake_engine_base import FakeEngineBase

BLOCK = 16
STEP_S = 0.002
"""Pretend time one request takes, in seconds (deadlines below it are missed)."""
WRONG_SHARE = {"int2-weight": 0.7, "int3-weight": 0.4, "int4-weight": 0.0, "int8-weight": 0.0, "int8-dynamic": 0.0}


@dataclass(frozen=True)
class Faults:
    """Bugs to plant in the engine."""

    tenant_blind_cache: bool = False
    """Prefix and response caches ignore the tenant."""
    batch_order_bug: bool = False
    """Every request after the first in a batch gets a corrupted last character."""
    weaker: bool = False
    """A smaller model: every fifth answer is wrong (used for fallbacks)."""
    shared_batch_bug: bool = False
    """A request answered while another is in flight (they share a batch) gets a corrupted answer."""
    stream_first_token_bug: bool = False
    """The first streamed token is wrong; the final text is right."""
    usage_extra: int = 0
    """usage.completion_tokens reports this many tokens more than were generated."""
    json_breaks_above: int = 0
    """With more than this many requests in flight, JSON answers lose their closing brace (0: never)."""


def oracle(prompt: str) -> str:
    """The right completion of a zoo prompt as the model sees it (a wrong guess when the clue is gone)."""
    if m := re.search(r'^\{"a":"(\d{3})","b":"(\d{3})"\}$', prompt):
        return '{"sum":"' + f"{int(m[1]) + int(m[2]):04d}" + '"}'
    if m := re.search(r"(\d{3})\+(\d{3})=$", prompt):
        return f"{int(m[1]) + int(m[2]):04d}"
    if m := re.match(r"^key=([A-Z]{4}); ", prompt):
        return m[1]
    return "ZZZZ"


def _unit(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 16**8


def _corrupt(answer: str) -> str:
    """A wrong answer of the same shape: the first digit (else the first capital letter) changed."""
    for i, ch in enumerate(answer):
        if ch.isdigit() or ch.isupper():
            new = str((int(ch) + 1) % 10) if ch.isdigit() else chr((ord(ch) - 64) % 26 + 65)
            return answer[:i] + new + answer[i + 1 :]
    return answer + "X"


@dataclass
class OracleEngine(FakeEngineBase):
    """Implements the Engine protocol over the oracle (the members it shares with other fakes: FakeEngineBase)."""

    served: ServedModel
    faults: Faults = field(default_factory=Faults)
    fallback: OracleEngine | None = None
    started: bool = False
    prefix_hits: int = 0
    prefix_misses: int = 0
    response_hits: int = 0
    fallback_uses: int = 0
    inflight: int = 0
    preprocessor: Any = None
    """No tokenizer: the oracle reads prompt text (one character per token)."""
    _blocks: set[tuple[str | None, str]] = field(default_factory=set)
    _responses: dict[tuple[str | None, str, int], FinishEvent] = field(default_factory=dict)

    async def start(self) -> None:
        """Nothing to load."""
        self.started = True
        if self.fallback is not None:
            await self.fallback.start()

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Nothing to release."""

    def stats(self) -> EngineStats:
        """Cache and fallback counters."""
        return EngineStats(
            prefix_cache_hits=self.prefix_hits,
            prefix_cache_misses=self.prefix_misses,
            response_cache_hits=self.response_hits,
            fallback_uses=self.fallback_uses,
        )

    # --- the model --------------------------------------------------------------------------------

    def _truncate(self, prompt: str) -> tuple[str, int]:
        pre = self.served.preprocess
        limit = pre.max_input_tokens - 1  # <bos> counts as a token
        if len(prompt) <= limit:
            return prompt, 0
        if pre.truncation == "reject":
            raise ServingError("input_too_long", tokens=len(prompt) + 1, limit=pre.max_input_tokens)
        drop = len(prompt) - limit
        if pre.truncation == "left":
            return prompt[drop:], drop
        if pre.truncation == "right":
            return prompt[:limit], drop
        half = limit // 2
        return prompt[:half] + prompt[len(prompt) - (limit - half) :], drop

    def _answer(self, seen: str) -> str:
        answer = oracle(seen)
        wrong = WRONG_SHARE.get(self.served.runtime.quantization.method, 0.0)
        if _unit("q" + seen) < wrong or (self.faults.weaker and _unit("w" + seen) < 0.2):
            answer = _corrupt(answer)
        return answer

    def _salt(self, request: GenerationRequest) -> str | None:
        kv = self.served.runtime.kv_cache
        global_scope = kv is not None and kv.cache_scope == "global"
        return None if (self.faults.tenant_blind_cache or global_scope) else request.tenant

    def _run(self, request: GenerationRequest, position: int = 0) -> Result:
        """One request, synchronously: deadline, truncation, caches, the model, the output cap."""
        now = time.monotonic()
        arrival = request.arrival_time if request.arrival_time is not None else now
        timeout = request.timeout_s if request.timeout_s is not None else self.served.failure_policy.request_timeout_s
        if now - arrival + STEP_S > timeout:
            return self._route(request, ServingError("deadline_exceeded", timeout_s=timeout), "timeout")
        prompt = request.prompt or ""
        try:
            seen, dropped = self._truncate(prompt)
        except ServingError as error:
            return ErrorEvent(request.id, error)
        rc = self.served.postprocess.response_cache
        rkey = (
            None if (rc.scope == "global" or self.faults.tenant_blind_cache) else request.tenant,
            prompt,
            request.params.max_tokens,
        )
        if rc.enabled and rkey in self._responses:
            self.response_hits += 1
            return replace(self._responses[rkey], request_id=request.id, cached=True)
        kv = self.served.runtime.kv_cache
        if kv is not None and kv.prefix_caching:
            for end in range(BLOCK, len(seen) + 2, BLOCK):
                key = (self._salt(request), seen[: end - 1])
                if key in self._blocks:
                    self.prefix_hits += 1
                else:
                    self.prefix_misses += 1
                    self._blocks.add(key)
        answer = self._answer(seen)
        if self.faults.batch_order_bug and position > 0:
            answer = _corrupt(answer)
        cap = min(request.params.max_tokens, self.served.postprocess.max_output_tokens)
        text, reason = (answer[:cap], "length") if len(answer) > cap else (answer, "eos")
        result = FinishEvent(
            request.id,
            text,
            tuple(ord(c) for c in text),
            reason,
            Usage(len(seen) + 1, len(text), dropped),
            e2e_s=STEP_S,
        )
        if rc.enabled:
            self._responses[rkey] = result
        return result

    def _route(self, request: GenerationRequest, error: ServingError, trigger: str) -> Result:
        policy = self.served.failure_policy.fallback
        if self.fallback is not None and policy is not None and trigger in policy.triggers:
            self.fallback_uses += 1
            result = self.fallback._run(replace(request, arrival_time=None, timeout_s=None))
            return replace(result, fallback_used=True) if isinstance(result, FinishEvent) else result
        return ErrorEvent(request.id, error)

    # --- the Engine API ---------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Result]:
        """Requests in batches of max_batch_size (one at a time for `none`); position matters only to the fault."""
        size = 1 if self.served.batching.mode == "none" else self.served.batching.max_batch_size
        return [self._run(r, i % size) for i, r in enumerate(requests)]

    async def submit(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Token events then the result; past max_queue requests in flight, the overload policy applies."""
        self.inflight += 1
        try:
            if self.inflight > self.served.failure_policy.max_queue:
                fail = self.served.failure_policy
                error = ServingError("overloaded", status=fail.overload_status, retry_after_s=fail.retry_after_s,
                                     retry_after=fail.retry_after_s)  # fmt: skip
                result = self._route(request, error, "overload")
            else:
                await asyncio.sleep(0.001)  # let a burst pile up
                result = self._planted(self._run(request))
            if isinstance(result, FinishEvent):
                for i, ch in enumerate(result.text):
                    first = i == 0 and self.faults.stream_first_token_bug
                    yield TokenEvent(request.id, (result.token_ids[i],), _corrupt(ch) if first else ch)
            yield result
        finally:
            self.inflight -= 1

    def _planted(self, result: Result) -> Result:
        """The faults that depend on what else is in flight, and the miscounted usage."""
        if not isinstance(result, FinishEvent):
            return result
        text, f = result.text, self.faults
        if f.shared_batch_bug and self.inflight > 1:
            text = _corrupt(text)
        if f.json_breaks_above and self.inflight > f.json_breaks_above and text.endswith("}"):
            text = text[:-1]
        usage = replace(result.usage, completion_tokens=len(text) + f.usage_extra)
        return replace(result, text=text, token_ids=tuple(ord(c) for c in text), usage=usage)

    async def embed(self, texts: Sequence[str], tenant: str | None = None) -> list[list[float]]:
        """Not an embedding model."""
        raise ServingError("invalid_request", detail="this model generates text")


def fake_factory(faults: Faults = Faults(), fallback_faults: Faults = Faults(weaker=True)):  # noqa: B008
    """An engine factory for run_check: the manifest's fallback is built too, as the runtime does."""

    def build(served: ServedModel) -> OracleEngine:
        backup = load_fallback(served)
        return OracleEngine(served, faults, OracleEngine(backup, fallback_faults) if backup is not None else None)

    return build


def gate_result(report: GateReport, name: str) -> GateResult:
    """The named gate's result in a report."""
    (result,) = [g for g in report.gates if g.name == name]
    return result


def reference_gate(served: ServedModel, cache_dir: Path, name: str = "contract") -> GateResult:
    """One gate forced on a manifest against its own reference form, on the real engines, outputs cached in
    `cache_dir`."""
    from servegate.gates.check import run_check
    from servegate.gates.suites.output_cache import OutputCache

    report = run_check(served.reference_form(), served, mode="reference", forced=(name,), cache=OutputCache(cache_dir))
    return gate_result(report, name)
