"""`runtime.backend: vllm` (servegate starts vLLM from the manifest) and `gate serve` as vLLM's contract gateway."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import openai
import pytest
from engines_support import MAX_MODEL_LEN, SERVED_NAME
from support.manifests import manifest_file

from servegate.capacity.bench.local_server import LocalServer
from servegate.contracts.manifest import ServedModel
from servegate.gates.check import run_check
from servegate.gates.suites.output_cache import OutputCache
from servegate.runtime.remote.vllm_process import VllmServer

pytestmark = pytest.mark.engines

TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"
"""A chat template that sends the last user turn as the prompt (zoo:tiny-primary has none of its own)."""


def test_gate_check_starts_vllm_from_the_manifest_gates_it_and_stops_it(vllm_python: Path, tmp_path: Path) -> None:
    reference = manifest_file(
        tmp_path / "reference.yaml",
        f"""name: tiny
weights: {{source: zoo:tiny-primary, dtype: float32}}
runtime: {{dtype: float32, max_model_len: {MAX_MODEL_LEN}}}
preprocess: {{max_input_tokens: 128}}
postprocess: {{max_output_tokens: 32}}
quality:
  suites:
    - {{name: arith, dataset: "zoo:arith", limit: 80, public: true}}
  margins: {{exact_match: 0.05}}
""",
    )
    data = reference.model_dump(mode="json")
    data["runtime"].update(
        backend="vllm",
        device="cpu",
        kv_cache={"block_size": 32, "memory_budget": "256MiB", "prefix_caching": False},
        vllm={"python": str(vllm_python), "log_dir": str(tmp_path / "vllm"), "startup_timeout_s": 600},
        warmup=[{"prompt": "the model 123+456=", "expect": "0579", "max_tokens": 8}],
    )
    data["batching"] = {"mode": "continuous", "max_batch_size": 8, "max_num_batched_tokens": 512}
    candidate = ServedModel.model_validate(data)
    report = run_check(reference, candidate, mode="change", forced=["quality", "contract"],
                       cache=OutputCache(enabled=False))  # fmt: skip
    verdicts = {g.name: (g.verdict, g.reason) for g in report.gates if g.verdict != "skipped"}
    assert verdicts["quality"][0] == "pass", verdicts
    assert verdicts["contract"][0] == "pass", verdicts
    assert report.candidate.remote.engine == "vllm"
    logs = list((tmp_path / "vllm").glob("vllm-*.log"))
    assert len(logs) == 1, logs  # one server, shared by every contract variant
    time.sleep(1.0)
    leftover = [p for p in Path("/proc").glob("[0-9]*/cmdline") if _is_vllm_of(p, tmp_path)]
    assert not leftover, "vLLM is still running after the check"


def _is_vllm_of(cmdline: Path, tmp_path: Path) -> bool:
    try:
        text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return "vllm.entrypoints" in text and str(tmp_path) in text


def test_gate_serve_in_front_of_vllm_with_the_openai_client(vllm_server: VllmServer, tmp_path: Path) -> None:
    (tmp_path / "chat.jinja").write_text(TEMPLATE)
    served = manifest_file(
        tmp_path / "gateway.yaml",
        f"""name: gateway
weights: {{source: zoo:tiny-primary}}
runtime:
  backend: endpoint
  endpoint_url: {vllm_server.launch.base_url}/v1
  endpoint_model: {SERVED_NAME}
  max_model_len: {MAX_MODEL_LEN}
preprocess: {{max_input_tokens: 64, chat_template: chat.jinja}}
postprocess: {{max_output_tokens: 32}}
batching: {{max_batch_size: 1}}
failure_policy: {{max_queue: 1, retry_after_s: 2, request_timeout_s: 20}}
""",
    )
    with LocalServer(served) as server:
        client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
        done = client.completions.create(model="gateway", prompt="the model 123+456=", max_tokens=8, temperature=0)
        assert done.choices[0].text == "0579"
        chat = client.chat.completions.create(
            model="gateway", messages=[{"role": "user", "content": "the model 123+456="}], max_tokens=8, temperature=0
        )
        assert chat.choices[0].message.content == "0579"
        streamed = client.completions.create(
            model="gateway", prompt="the model 123+456=", max_tokens=8, temperature=0, stream=True
        )
        assert "".join(c.choices[0].text for c in streamed if c.choices) == "0579"
        with pytest.raises(openai.BadRequestError) as too_long:
            client.completions.create(model="gateway", prompt="the model " + "1+" * 60 + "1=", max_tokens=4)
        assert too_long.value.body["code"] == "input_too_long"  # type: ignore[index]
        answers = asyncio.run(burst(server.url))
    statuses = sorted(r.status_code for r in answers)
    assert statuses.count(429) >= 3, statuses  # one at vLLM, one waiting, the rest overloaded
    assert all(r.headers.get("retry-after") == "2" for r in answers if r.status_code == 429)


async def burst(url: str) -> list[httpx.Response]:
    """Six requests at once to the gateway."""
    async with httpx.AsyncClient(timeout=60) as http:
        body = {"model": "gateway", "prompt": "12+34=", "max_tokens": 32, "ignore_eos": True}
        return list(await asyncio.gather(*(http.post(url + "/completions", json=body) for _ in range(6))))
