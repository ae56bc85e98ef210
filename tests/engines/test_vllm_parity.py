"""servegate's reference runtime and vLLM give the same greedy text on the zoo's generation suites.

Both run zoo:tiny-primary in fp32; vLLM is reached the way a user reaches a remote deployment, through
an endpoint manifest. Every item of both splits (test, calibration) whose prompt plus completion fits
max_model_len is compared, and every item that differs is printed with its prompt and both outputs.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from engines_support import MAX_MODEL_LEN, endpoint_manifest, reference_manifest
from transformers import AutoTokenizer

from servegate.contracts.quality_section import Suite
from servegate.gates.suites.evaluation import ItemOutput, SuiteItem, generate, load_suite_data, requests_for
from servegate.runtime import build
from servegate.runtime.engine.interface import Engine
from servegate.runtime.remote.vllm_process import VllmServer
from servegate.zoo import SPLITS, zoo_model_path

pytestmark = pytest.mark.engines

GENERATION_SUITES = ("arith", "recall", "json")
"""The zoo's suites the causal models answer (similarity is an embedding suite)."""
VLLM_CONCURRENCY = 8


def fitting_items(suite: Suite, items: tuple[SuiteItem, ...]) -> list[SuiteItem]:
    """Items whose prompt (with <bos>) plus the suite's max_tokens fit in max_model_len."""
    tokenizer = AutoTokenizer.from_pretrained(zoo_model_path("tiny-primary"))
    return [i for i in items if len(tokenizer(i.prompt)["input_ids"]) + suite.max_tokens <= MAX_MODEL_LEN]


def outputs_of(engine: Engine, suite_data: object, items: list[SuiteItem], chunk: int) -> list[ItemOutput]:
    """Greedy outputs of `engine` for `items`, `chunk` requests in flight at a time."""
    results = generate(engine, requests_for(suite_data, items), chunk=chunk)  # type: ignore[arg-type]
    return [ItemOutput.from_result(item.id, result) for item, result in zip(items, results, strict=True)]


def test_vllm_and_the_reference_runtime_agree_token_for_token_on_every_generation_suite_item(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    reference_served = reference_manifest(tmp_path)
    endpoint_served = endpoint_manifest(tmp_path, vllm_server)
    reference, remote = build(reference_served), build(endpoint_served)
    differences: list[str] = []
    compared = 0
    try:
        for name, split in itertools.product(GENERATION_SUITES, SPLITS):
            suite = Suite(name=f"{name}-{split}", dataset=f"zoo:{name}", split=split)
            data = load_suite_data(reference_served, suite)
            items = fitting_items(suite, data.items)
            assert len(items) == len(data.items), f"{suite.name}: every zoo item fits {MAX_MODEL_LEN} tokens"
            started = time.monotonic()
            expected = outputs_of(reference, data, items, chunk=64)
            middle = time.monotonic()
            got = outputs_of(remote, data, items, chunk=VLLM_CONCURRENCY)
            print(
                f"\n{suite.name}: {len(items)} items, reference {middle - started:.1f} s, "
                f"vLLM {time.monotonic() - middle:.1f} s at concurrency {VLLM_CONCURRENCY}"
            )
            for item, ours, theirs in zip(items, expected, got, strict=True):
                assert ours.error is None, f"{item.id}: the reference runtime failed: {ours.error}"
                assert theirs.error is None, f"{item.id}: vLLM failed: {theirs.error}"
                compared += 1
                if ours.text != theirs.text:
                    differences.append(
                        f"{item.id}: prompt {item.prompt!r}: reference {ours.text!r}, vLLM {theirs.text!r}"
                    )
    finally:
        shutdown = getattr(reference, "shutdown_sync", None)
        if shutdown is not None:
            shutdown()
    for line in differences:
        print(line)
    assert compared >= 2100  # 500 test and 200 calibration items per suite
    assert not differences, f"{len(differences)} of {compared} items differ (printed above); first: {differences[0]}"
