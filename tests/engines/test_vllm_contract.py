"""servegate in front of a real vLLM: the manifest's contract holds, and the gates measure vLLM or say why not.

All against the session's vLLM server (zoo:tiny-primary, max-model-len 256), reached as a user reaches a
remote deployment: an endpoint manifest. vLLM itself accepts prompts up to 256 tokens and never answers 429;
every refusal below comes from servegate's contract layer.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engines_support import MAX_MODEL_LEN, SERVED_NAME
from support.manifests import manifest_file

from servegate.contracts.manifest import ServedModel
from servegate.gates.check import check_manifest, run_check
from servegate.gates.suites.output_cache import OutputCache
from servegate.runtime import build
from servegate.runtime.remote.vllm_process import VllmServer
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest, SamplingParams

pytestmark = pytest.mark.engines

NARROW = "preprocess: {max_input_tokens: 128}\nbatching: {max_batch_size: 1}\nfailure_policy: {max_queue: 1}\n"
"""One request at vLLM at a time, one waiting: the rest of a burst is overloaded."""
LONG = "the model " + "+".join(str(i) for i in range(1, 40)) + "="  # ~110 tokens: under vLLM's 256, over 64


def endpoint(directory: Path, server: VllmServer, extra: str = "", name: str = "vllm-endpoint") -> ServedModel:
    """An endpoint manifest at the session's vLLM, with YAML `extra` appended (sections it adds or replaces)."""
    return manifest_file(
        directory / f"{name}.yaml",
        f"""name: {name}
weights: {{source: zoo:tiny-primary}}
runtime:
  backend: endpoint
  endpoint_url: {server.launch.base_url}/v1
  endpoint_model: {SERVED_NAME}
  max_model_len: {MAX_MODEL_LEN}
postprocess: {{max_output_tokens: 32, logprobs: true}}
{extra}""",
    )


def suites(limit: int) -> str:
    return f"""quality:
  suites:
    - {{name: arith, dataset: "zoo:arith", limit: {limit}, public: true}}
    - {{name: recall, dataset: "zoo:recall", limit: {limit}, public: true}}
  margins: {{exact_match: 0.05}}
"""


def check(base: ServedModel, cand: ServedModel, *gates: str) -> Any:
    return run_check(base, cand, mode="change", forced=list(gates), cache=OutputCache(enabled=False))


def test_limits_truncation_logprobs_and_the_queue_bound_hold_in_front_of_vllm(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    strict = build(endpoint(tmp_path, vllm_server, "preprocess: {max_input_tokens: 64}", name="strict"))
    [rejected] = strict.generate([GenerationRequest("long", prompt=LONG)])
    assert isinstance(rejected, ErrorEvent) and rejected.error.code == "input_too_long"  # vLLM would answer 200

    cut = build(endpoint(tmp_path, vllm_server, "preprocess: {max_input_tokens: 64, truncation: left}", name="cut"))
    params = SamplingParams(max_tokens=4, logprobs=True)
    [answer] = cut.generate([GenerationRequest("cut", prompt=LONG, params=params)])
    assert isinstance(answer, FinishEvent), answer
    assert answer.usage.prompt_tokens == 64 and answer.usage.truncated_tokens > 0
    assert answer.logprobs is not None and len(answer.logprobs) >= len(answer.text) and max(answer.logprobs) <= 0

    narrow = build(endpoint(tmp_path, vllm_server, NARROW,
                            name="narrow"))  # fmt: skip
    narrow.start_sync()

    async def burst() -> list[Any]:
        async def one(i: int) -> Any:
            request = GenerationRequest(f"b{i}", prompt="12+34=", params=SamplingParams(max_tokens=32, ignore_eos=True))
            return [e async for e in narrow.submit(request)][-1]

        return list(await asyncio.gather(*(one(i) for i in range(6))))

    codes = [r.error.code if isinstance(r, ErrorEvent) else "ok" for r in asyncio.run(burst())]
    assert codes.count("ok") == 2 and codes.count("overloaded") == 4, codes  # one at vLLM, one waiting

    hasty = build(endpoint(tmp_path, vllm_server, "preprocess: {max_input_tokens: 128}\n"
                           "failure_policy: {request_timeout_s: 0.01}", name="hasty"))  # fmt: skip
    request = GenerationRequest("late", prompt="12+34=", params=SamplingParams(max_tokens=32, ignore_eos=True))
    [late] = hasty.generate([request])
    assert isinstance(late, ErrorEvent) and late.error.code == "deadline_exceeded", late


def test_logprobs_pass_through_an_endpoint_in_front_of_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    """vLLM's own token ids (`return_token_ids`), and its logprobs in the OpenAI shape, lists of one length."""
    import httpx

    from servegate.server import create_app

    served = endpoint(
        tmp_path, vllm_server, "preprocess: {max_input_tokens: 128, chat_template: none}", name="logprobs"
    )
    params = SamplingParams(max_tokens=8, logprobs=True, top_logprobs=2)
    [answer] = build(served).generate([GenerationRequest("lp", prompt="the model 123+456=", params=params)])
    assert isinstance(answer, FinishEvent) and answer.token_source == "remote", answer
    assert answer.logprobs is not None and answer.tokens is not None and answer.top_logprobs is not None
    n = answer.usage.completion_tokens
    assert len(answer.token_ids) == len(answer.logprobs) == len(answer.tokens) == len(answer.top_logprobs) == n > 0

    async def ask() -> list[httpx.Response]:
        app = create_app(served)
        completion = {"model": "logprobs", "prompt": "the model 123+456=", "max_tokens": 8, "temperature": 0,
                      "logprobs": 2}  # fmt: skip
        chat = {"model": "logprobs", "messages": [{"role": "user", "content": "12+34="}], "max_tokens": 8,
                "temperature": 0, "logprobs": True}  # fmt: skip
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gate", timeout=120) as client:
                for _ in range(600):
                    if (await client.get("/ready")).status_code == 200:
                        break
                    await asyncio.sleep(0.1)
                return [await client.post("/v1/completions", json=completion),
                        await client.post("/v1/chat/completions", json=chat)]  # fmt: skip

    through, talk = asyncio.run(ask())
    assert through.status_code == 200 and talk.status_code == 200, (through.text, talk.text)
    logprobs = through.json()["choices"][0]["logprobs"]
    lengths = {len(logprobs[k]) for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    assert lengths == {through.json()["usage"]["completion_tokens"]}
    assert "".join(logprobs["tokens"]).startswith(through.json()["choices"][0]["text"])
    content = talk.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == talk.json()["usage"]["completion_tokens"] > 0 and all(c["logprob"] <= 0 for c in content)


def test_gates_on_a_vllm_endpoint_measure_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    base = reference_with_suites(tmp_path)
    same = endpoint(tmp_path, vllm_server, "preprocess: {max_input_tokens: 128}\n" + suites(80), name="same")
    report = check(base, same, "quality")
    [quality] = [g for g in report.gates if g.name == "quality"]
    assert quality.verdict == "pass", quality.reason  # vLLM's greedy text is the reference's
    assert quality.measurements.ran_on.startswith("vllm 0.32.0")
    assert report.candidate.remote.version == "0.32.0"

    # a planted fault: a context limit that cuts recall's key (the code sits at the start of the prompt)
    cut = endpoint(tmp_path, vllm_server, "preprocess: {max_input_tokens: 24, truncation: left}\n" + suites(80),
                   name="cut")  # fmt: skip
    report = check(base, cut, "truncation")
    [truncation] = [g for g in report.gates if g.name == "truncation"]
    assert truncation.verdict == "fail", truncation.reason


def reference_with_suites(directory: Path) -> ServedModel:
    """servegate's reference runtime on the same weights, with the suites the gates run."""
    return manifest_file(
        directory / "reference-suites.yaml",
        f"""name: reference
weights: {{source: zoo:tiny-primary, dtype: float32}}
runtime: {{dtype: float32, max_model_len: {MAX_MODEL_LEN}}}
preprocess: {{max_input_tokens: 128}}
postprocess: {{max_output_tokens: 32, logprobs: true}}
{suites(80)}""",
    )


def test_memory_of_vllm_is_not_read_off_its_api_process(vllm_server: VllmServer, tmp_path: Path) -> None:
    cand = endpoint(
        tmp_path,
        vllm_server,
        """preprocess: {max_input_tokens: 128}
capacity:
  workload: {input_tokens: {mean: 16}, output_tokens: {mean: 4}, arrival: poisson, rate_rps: 4, num_requests: 12}
  targets: {e2e_ms: {p50: 60000}, memory: 1GiB}
""",
    )
    report = check_manifest(cand, forced=["capacity"], cache=OutputCache(enabled=False))  # absolute targets
    [capacity] = [g for g in report.gates if g.name == "capacity"]
    assert capacity.verdict == "warn", capacity.reason  # the API process alone is < 1 GiB; vLLM in all is ~3 GiB
    assert "API process only" in capacity.reason


def test_gate_bench_runs_against_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    from servegate.zoo import zoo_model_path

    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "servegate.cli", "bench", "--url", f"{vllm_server.launch.base_url}/v1", "--model",
         SERVED_NAME, "--rate", "4", "--requests", "12", "--tokenizer", str(zoo_model_path("tiny-primary")),
         "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(out.read_text())["requests"]["completed"] == 12
