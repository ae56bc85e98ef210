"""The bench checks itself: failures by class (exit 1), the workload's shape from `usage`, and the client's delay."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from support.synthetic_server import Delays, Faults, SyntheticServer
from typer.testing import CliRunner

from servegate.capacity.bench.load_generator import run_bench
from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.bench.targets import HttpTarget, PromptFactory
from servegate.capacity.bench.workload import RequestSpec
from servegate.cli.app import app
from servegate.contracts.capacity_section import LengthDistribution, Workload
from servegate.contracts.errors import ServegateError


class CharTokenizer:
    """One token per character: the synthetic server counts prompts the same way."""

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


def workload(**kw: Any) -> Workload:
    base = {"input_tokens": LengthDistribution(mean=12, max=12), "output_tokens": LengthDistribution(mean=6, max=6)}
    return Workload.model_validate({**base, "rate_rps": 40, "num_requests": 12, **kw})


def bench(url: str, wl: Workload, tokenizer: Any = None, wrap: Any = None) -> dict[str, Any]:
    async def go() -> Any:
        target = HttpTarget(url, model="m")
        await target.probe()
        try:
            return await run_bench(wrap(target) if wrap else target, wl, PromptFactory(tokenizer), target_name=url)
        finally:
            await target.aclose()

    return asyncio.run(go()).as_dict()  # type: ignore[no-any-return]


def test_a_server_that_rejects_every_prompt_fails_the_bench_with_the_error_classes(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["bench", "--rate", "20", "--requests", "10", "--header", "X-Tenant: acme", "--json", str(out)]
    with SyntheticServer(Delays(ttft_ms=5, itl_ms=1), faults=Faults(max_prompt_chars=20)) as server:
        done = CliRunner().invoke(app, [*args[:1], "--url", server.url, *args[1:]], env={"COLUMNS": "200"})
        headers = server.last_headers
    assert done.exit_code == 1, done.output
    assert "bench failed: 10 of 10 requests failed (100.0%, more than the 0.0% allowed" in done.output
    assert "HTTP 400 context_length_exceeded x 10" in done.output
    assert "prompt lengths are approximate" in done.output and "nan" not in done.output
    assert headers["x-tenant"] == "acme"
    report = json.loads(out.read_text())
    assert report["errors"]["by_class"] == {"HTTP 400 context_length_exceeded": 10} and report["errors"]["exceeded"]


def test_a_declared_error_share_lets_failures_pass_and_a_bad_header_is_a_usage_error() -> None:
    with SyntheticServer(Delays(), faults=Faults(max_prompt_chars=20)) as server:
        allowed = CliRunner().invoke(app, ["bench", "--url", server.url, "--rate", "50", "--requests", "5",
                                           "--max-error-share", "1"])  # fmt: skip
        bad = CliRunner().invoke(app, ["bench", "--url", server.url, "--rate", "5", "--header", "X-Tenant"])
    assert allowed.exit_code == 0, allowed.output
    assert "within the 100.0% allowed" in allowed.output
    assert isinstance(bad.exception, ServegateError) and "NAME:VALUE" in str(bad.exception)  # `gate` exits 2


def test_an_honest_server_with_a_tokenizer_achieves_the_shape() -> None:
    with SyntheticServer(Delays(ttft_ms=2, itl_ms=1)) as server:
        report = bench(server.url, workload(), CharTokenizer())
    shape = report["workload_shape"]
    assert shape["achieved"] and shape["exact_prompts"] and shape["ignore_eos"]
    assert shape["prompt_tokens"] == {"requested": 144, "reported": 144}
    assert shape["output_tokens"]["reported"] == shape["output_tokens"]["requested"] == 72
    assert not [w for w in report["warnings"] if "the server at" in w]


def test_truncated_prompts_and_outputs_stopped_early_are_named() -> None:
    with SyntheticServer(Delays(), faults=Faults(keep_prompt_tokens=8, stop_after=3)) as server:
        report = bench(server.url, workload(), CharTokenizer())
        url = server.url
    shape = report["workload_shape"]
    assert not shape["achieved"]
    assert shape["stopped_early"] == 12 and shape["output_tokens_missing"] == 36
    assert shape["prompt_truncated"] == 12 and shape["prompt_tokens"]["reported"] == 96
    warnings = "\n".join(report["warnings"])
    assert f"the server at {url} stopped 12 of 12 responses before max_tokens although ignore_eos" in warnings
    assert "counted other prompt lengths than the tokenizer's in 12 of 12 (12 shorter: truncated?)" in warnings


def test_a_server_that_miscounts_usage_is_named() -> None:
    with SyntheticServer(Delays(), faults=Faults(usage_extra_tokens=-2)) as under:
        low = bench(under.url, workload())
    with SyntheticServer(Delays(), faults=Faults(usage_extra_tokens=3)) as over:
        high = bench(over.url, workload())
    assert low["workload_shape"]["chunks_over_usage"] == 12
    assert any("streamed more output chunks than the completion tokens" in w and under.url in w
               for w in low["warnings"])  # fmt: skip
    assert high["workload_shape"]["over_max_tokens"] == 12
    assert any("more completion tokens than max_tokens in 12 of 12" in w for w in high["warnings"])


class SlowClient:
    """A client that holds the event loop for 30 ms before each send: it falls behind any schedule faster than that."""

    def __init__(self, target: HttpTarget) -> None:
        self.target = target
        self.ignore_eos = target.ignore_eos

    async def send(self, spec: RequestSpec, prompt: str, record: RequestRecord) -> None:
        time.sleep(0.03)  # blocking on purpose: nothing else runs, later sends go out late
        await self.target.send(spec, prompt, record)

    async def aclose(self) -> None:
        await self.target.aclose()


def test_a_slow_client_is_client_limited_and_a_quick_one_is_not() -> None:
    with SyntheticServer(Delays(ttft_ms=200, itl_ms=1)) as server:
        slow = bench(server.url, workload(rate_rps=100, num_requests=20), wrap=SlowClient)
    # 1% of a 1 s TTFT is 10 ms: even on a machine shared by many jobs the plain client sends well within it
    with SyntheticServer(Delays(ttft_ms=1000, itl_ms=1)) as server:
        quick = bench(server.url, workload(rate_rps=10, num_requests=20))
    assert slow["client_limited"] is True
    client = slow["client"]
    assert client["dispatch_delay_mean_ms"] > client["delay_limit_ms"] > 1.5
    assert client["achieved_rate_rps"] < 0.95 * client["scheduled_rate_rps"]
    assert any(w.startswith("1 of 1 run(s) client-limited: the client sent requests") for w in slow["warnings"])
    assert slow["dispatch_delay_ms"]["p99"] > 100  # 20 sends 30 ms apart against a 10 ms schedule
    assert quick["client_limited"] is False, quick["client"]
    assert quick["dispatch_delay_ms"]["count"] == 20
