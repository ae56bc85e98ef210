"""vLLM's request fields mean on servegate's reference runtime what they mean on vLLM, on the same fp32 weights:
truncate_prompt_tokens and truncation_side keep the same tokens (vLLM's own truncation, sent the text prompt), so
the same greedy answers and prompt_tokens, for each side and without one (vLLM's left); and
return_tokens_as_token_ids names the same tokens and alternatives through the endpoint backend in front of vLLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from engines_support import SERVED_NAME, endpoint_manifest, reference_manifest

from servegate.contracts.quality_section import Suite
from servegate.contracts.requests import parse_request
from servegate.gates.suites.evaluation import load_suite_data
from servegate.runtime import build
from servegate.runtime.remote.vllm_process import VllmServer
from servegate.runtime.request_translator import engine_requests
from servegate.runtime.types import FinishEvent

pytestmark = pytest.mark.engines

ITEMS = 30
KEEP = 10


def arith_prompts(served: Any) -> list[str]:
    """The first ITEMS prompts of the zoo's arith suite."""
    return [item.prompt for item in load_suite_data(served, Suite(name="arith", dataset="zoo:arith")).items[:ITEMS]]


def test_truncated_prompts_agree_with_vllms_own_truncation(vllm_server: VllmServer, tmp_path: Path) -> None:
    served = reference_manifest(tmp_path)
    prompts = arith_prompts(served)
    engine = build(served)
    failures = []
    try:
        for side in (None, "left", "right"):
            fields: dict[str, Any] = {"truncate_prompt_tokens": KEEP, **({"truncation_side": side} if side else {})}
            requests = []
            for i, prompt in enumerate(prompts):
                body = {"model": served.name, "prompt": prompt, "max_tokens": 8, "temperature": 0, **fields}
                requests += engine_requests(served, parse_request(served, "completions", body), f"r{i}", None)
            ours = engine.generate(requests)
            agree, differ = 0, []
            for prompt, mine in zip(prompts, ours, strict=True):
                assert isinstance(mine, FinishEvent), mine
                body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 8, "temperature": 0, **fields}
                theirs = httpx.post(f"{vllm_server.launch.base_url}/v1/completions", json=body, timeout=60).json()
                if not theirs["usage"]["prompt_tokens"] == mine.usage.prompt_tokens <= KEEP:
                    failures.append(
                        f"{side}: prompt_tokens {theirs['usage']['prompt_tokens']} and {mine.usage.prompt_tokens}"
                    )
                if theirs["choices"][0]["text"] == mine.text:
                    agree += 1
                else:
                    differ.append((prompt, mine.text, theirs["choices"][0]["text"]))
            print(f"\ntruncation_side {side}: vLLM gives the same answer on {agree} of {ITEMS}; {differ[:3]}")
            if agree < 0.85 * ITEMS:  # greedy near-ties of fp32 (vLLM's prefix cache reorders sums on repeats)
                failures.append(f"{side}: {agree} of {ITEMS} agree")
    finally:
        engine.shutdown_sync()
    assert not failures, failures


def test_token_id_names_agree_through_the_endpoint_in_front_of_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    reference_served = reference_manifest(tmp_path, postprocess="\n  logprobs: true")
    remote_served = endpoint_manifest(tmp_path, vllm_server, postprocess="\n  logprobs: true")
    prompts = [
        item.prompt
        for item in load_suite_data(reference_served, Suite(name="arith", dataset="zoo:arith")).items[:ITEMS]
    ]
    named = {}
    for side, served in (("reference", reference_served), ("vLLM", remote_served)):
        engine = build(served)
        try:
            requests = []
            for i, prompt in enumerate(prompts):
                body = {"model": served.name, "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 2,
                        "return_tokens_as_token_ids": True}  # fmt: skip
                requests += engine_requests(served, parse_request(served, "completions", body), f"r{i}", None)
            results = engine.generate(requests)
        finally:
            engine.shutdown_sync()
        assert all(isinstance(r, FinishEvent) for r in results), results
        named[side] = [(r.tokens, tuple(sorted(t) for t in r.top_logprobs or ())) for r in results]  # type: ignore[union-attr]
        assert all(name.startswith("token_id:") for tokens, _ in named[side] for name in tokens or ()), side
    agree = sum(a == b for a, b in zip(named["reference"], named["vLLM"], strict=True))
    print(f"\nreturn_tokens_as_token_ids: vLLM names the same tokens and alternatives on {agree} of {ITEMS}")
    assert agree >= 0.9 * ITEMS
