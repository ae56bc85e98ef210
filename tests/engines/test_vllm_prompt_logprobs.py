"""prompt_logprobs means on servegate what it means on vLLM, on the same fp32 weights: the reference runtime and
the endpoint backend in front of vLLM answer the same prompt tokens, log-probabilities, ranks and alternatives as
vLLM itself (near-ties of fp32 sums aside)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from engines_support import SERVED_NAME, endpoint_manifest, reference_manifest
from support.servers import ready_app

from servegate.contracts.quality_section import Suite
from servegate.gates.suites.evaluation import load_suite_data
from servegate.runtime.remote.vllm_process import VllmServer

pytestmark = pytest.mark.engines

ITEMS = 20
TOP = 3


def entries(post: Any, model: str, prompt: str) -> list[Any]:
    answer = post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0,
                                           "prompt_logprobs": TOP})  # fmt: skip
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["prompt_logprobs"]


def agreement(ours: list[Any], theirs: list[Any]) -> tuple[list[str], int, int, int]:
    """(problems, positions, positions with the same rank, positions with the same alternatives)."""
    problems, same_rank, same_top = [], 0, 0
    if len(ours) != len(theirs) or ours[0] is not None or theirs[0] is not None:
        return [f"{len(ours)} entries against {len(theirs)}"], 0, 0, 0
    for mine, their in zip(ours[1:], theirs[1:], strict=True):
        (token, own), (their_token, their_own) = next(iter(mine.items())), next(iter(their.items()))
        if token != their_token or abs(own["logprob"] - their_own["logprob"]) > 1e-3:
            problems.append(f"token {token} {own['logprob']:.5f} against {their_token} {their_own['logprob']:.5f}")
        same_rank += own["rank"] == their_own["rank"]
        same_top += set(mine) == set(their)
    return problems, len(ours) - 1, same_rank, same_top


def test_prompt_logprobs_agree_with_vllm_on_both_backends(vllm_server: VllmServer, tmp_path: Path) -> None:
    reference = reference_manifest(tmp_path, postprocess="\n  logprobs: true")
    gateway = endpoint_manifest(tmp_path, vllm_server, postprocess="\n  logprobs: true")
    prompts = [item.prompt for item in load_suite_data(reference, Suite(name="arith", dataset="zoo:arith")).items]
    vllm = vllm_server.launch.base_url
    theirs = [entries(lambda p, **kw: httpx.post(vllm + p, timeout=60, **kw), SERVED_NAME, q) for q in prompts[:ITEMS]]
    for served in (reference, gateway):
        for client in ready_app(served):
            ours = [entries(client.post, served.name, prompt) for prompt in prompts[:ITEMS]]
        problems, positions, ranks, tops = [], 0, 0, 0
        for mine, their in zip(ours, theirs, strict=True):
            wrong, n, r, t = agreement(mine, their)
            problems += wrong
            positions, ranks, tops = positions + n, ranks + r, tops + t
        print(
            f"\n{served.name}: {positions} prompt positions; the same rank at {ranks}, the same alternatives at {tops}"
        )
        assert not problems, (served.name, problems[:5])
        assert ranks >= 0.95 * positions and tops >= 0.9 * positions, served.name
