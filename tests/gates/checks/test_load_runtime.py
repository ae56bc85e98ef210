"""The load gate on servegate's real runtime (zoo:tiny-primary): a safe model passes, and a planted engine fault
(outputs that depend on what else is in flight) is caught through the same HTTP path."""

from __future__ import annotations

from typing import Any

from support.oracle_engine import gate_result

from servegate.contracts.manifest import ServedModel
from servegate.gates.check import run_check
from servegate.gates.suites.output_cache import OutputCache

MANIFEST: dict[str, Any] = {
    "name": "tiny-load",
    "weights": {"source": "zoo:tiny-primary"},
    "preprocess": {"chat_template": "none", "max_input_tokens": 64, "truncation": "left"},
    "runtime": {"max_model_len": 128, "kv_cache": {"block_size": 16, "memory_budget": "4MiB"}},
    "batching": {"mode": "continuous", "max_batch_size": 4, "max_num_batched_tokens": 256},
    "postprocess": {"max_output_tokens": 16},
    "quality": {
        "suites": [
            {"name": "arith", "dataset": "zoo:arith", "limit": 8, "public": True},
            {"name": "json", "dataset": "zoo:json", "limit": 8, "public": True},
        ]
    },  # fmt: skip
}


class SharedBatchFault:
    """The reference engine with one bug: an answer that finishes while another request is in flight loses a char."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.inflight = engine, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def submit(self, request: Any) -> Any:
        from dataclasses import replace

        from servegate.runtime.types import FinishEvent

        self.inflight += 1
        try:
            async for event in self.engine.submit(request):
                if isinstance(event, FinishEvent) and self.inflight > 1 and event.text:
                    event = replace(event, text=event.text[1:], token_ids=event.token_ids[1:])
                yield event
        finally:
            self.inflight -= 1


def check(factory: Any = None) -> Any:
    served = ServedModel.model_validate(MANIFEST)
    report = run_check(served.reference_form(), served, mode="reference", forced=["load"],
                       engine_factory=factory, cache=OutputCache(enabled=False))  # fmt: skip
    return gate_result(report, "load")


def test_the_reference_runtime_holds_under_load() -> None:
    result = check()
    assert result.verdict == "pass", result.reason
    m = result.measurements
    assert m.concurrency == 4 and m.quality.items == 12 and m.streaming.streams == 12
    assert m.streaming.usage_miscounts == 0 and m.streaming.max_tokens_exceeded == 0
    assert m.streaming.token_count == "token ids"  # servegate's app answers return_token_ids: nothing re-tokenized


def test_a_reference_engine_that_changes_answers_in_a_shared_batch_fails() -> None:
    from servegate.runtime import build

    result = check(lambda served: SharedBatchFault(build(served)))
    assert result.verdict == "fail" and "outputs change under load" in result.reason
