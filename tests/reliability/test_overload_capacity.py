"""Overload at about 4x the capacity the planner predicts: the server stays up, answers the declared status with
Retry-After, ends every request exactly once, keeps its memory bounded, and is fast again after the burst.

The capacity is the planner's own figure for the manifest's batching policy (`saturation_throughput` over
`sim_setup`, the simulation of the runtime's scheduler and KV pool) with a latency model fitted here on
the very runner the server uses (`time_steps` + `fit_model_steps`, as `gate profile` does). Every model step is
slowed by STEP_DELAY_S (sleeping, as a bigger model would take on this CPU) so that 4x capacity is a rate
a Python client on two shared cores can really send. Arrivals are open-loop Poisson; one request in four
streams. The instant 100-request burst against the queue bound is tests/server/test_api.py; the fake-engine
burst with the server's own counts is tests/server/test_server_overload.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from reliability_engine import MODEL_NAME, SlowRunner, manifest_data, model_source, rss_bytes
from reliability_server import start_server
from support.servers import ServerProcess

from servegate.contracts.capacity_section import LengthDistribution, Workload
from servegate.contracts.manifest import ServedModel

pytestmark = pytest.mark.reliability

STEP_DELAY_S = 0.02
PROMPT = "the quick brown fox jumps"  # 25 characters: 26 tokens with <bos>
OUTPUT_TOKENS = 16
OVERLOAD_FACTOR = 4.0
RETRY_AFTER_S = 1
TIMEOUT_S = 4.0


def overload_manifest(folder: Path) -> dict[str, Any]:
    """Continuous batching of 4, a queue of 8, a 4 s deadline, overload answered 429 with Retry-After 1."""
    return manifest_data(
        model_source(folder),
        batching={"mode": "continuous", "max_batch_size": 4, "max_num_batched_tokens": 256},
        failure_policy={
            "max_queue": 8,
            "overload": "reject",
            "overload_status": 429,
            "retry_after_s": RETRY_AFTER_S,
            "request_timeout_s": TIMEOUT_S,
        },
    )


def predicted_capacity_rps(served: ServedModel) -> tuple[float, dict[str, Any]]:
    """The planner's requests/s for this manifest, from a latency model fitted on the slowed runner."""
    from servegate.capacity.latency.prediction import saturation_throughput, sim_setup
    from servegate.capacity.latency.profile import fit_model_steps
    from servegate.capacity.latency.step_timing import ProfileLimits, step_grid, time_steps
    from servegate.runtime.engine.parts import build_parts

    runner = SlowRunner(build_parts(served).runner, STEP_DELAY_S)
    limits = ProfileLimits(
        max_prompt_tokens=served.preprocess.max_input_tokens,
        max_batch_size=served.batching.max_batch_size,
        max_num_batched_tokens=served.batching.max_num_batched_tokens,
        max_context=served.runtime.max_model_len,
    )
    samples = time_steps(runner, step_grid(limits, runner.num_blocks, runner.block_size), repeats=1)
    model = fit_model_steps(samples)
    tokens = LengthDistribution(distribution="fixed", mean=len(PROMPT) + 1, min=1, max=len(PROMPT) + 1)
    outputs = LengthDistribution(distribution="fixed", mean=OUTPUT_TOKENS, min=1, max=OUTPUT_TOKENS)
    workload = Workload(input_tokens=tokens, output_tokens=outputs, arrival="poisson", rate_rps=1.0)
    capacity = saturation_throughput(sim_setup(served), model, workload, num_requests=100)
    return capacity, {"steps timed": len(samples), "coefficients": model.steps.as_dict()}


@dataclass
class Outcome:
    """How one request ended, seen by its client."""

    kind: str
    """completed, rejected, timed_out, lost or wrong."""
    status: int | None
    seconds: float
    detail: str = ""


@dataclass
class RssSampler:
    """Samples a process's RSS every 0.1 s in a thread."""

    pid: int
    samples: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> RssSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.samples.append(rss_bytes(self.pid))
            except (OSError, RuntimeError):
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def classify(status: int, headers: httpx.Headers, text: str, stream: bool) -> tuple[str, str]:
    """completed / rejected / timed_out, or wrong with the reason (exactly one per request)."""
    if status == 429:
        error = json.loads(text)["error"]
        ok = error["code"] == "overloaded" and headers.get("retry-after") == str(RETRY_AFTER_S)
        return ("rejected", "") if ok else ("wrong", f"429 without the declared Retry-After: {headers} {text[:200]}")
    if status == 504:
        ok = json.loads(text)["error"]["code"] == "deadline_exceeded"
        return ("timed_out", "") if ok else ("wrong", text[:200])
    if status != 200:
        return "wrong", f"{status}: {text[:200]}"
    if not stream:
        body = json.loads(text)
        whole = body["usage"]["completion_tokens"] == OUTPUT_TOKENS and body["choices"][0]["finish_reason"] == "length"
        return ("completed", "") if whole else ("wrong", f"incomplete result {text[:200]}")
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return "wrong", f"a stream that did not end in [DONE]: {text[-200:]}"
    payloads = [json.loads(e) for e in events[:-1]]
    errors = [p["error"] for p in payloads if "error" in p]
    if errors:
        timed_out = len(errors) == 1 and errors[0]["code"] == "deadline_exceeded" and "error" in payloads[-1]
        return ("timed_out", "") if timed_out else ("wrong", f"stream errors {errors}")
    finished = [p for p in payloads if p.get("choices") and p["choices"][0].get("finish_reason")]
    return ("completed", "") if len(finished) == 1 else ("wrong", "a stream without exactly one finish")


async def one_request(client: httpx.AsyncClient, index: int, stream: bool) -> Outcome:
    """Send one completion; classify how it ended. No answer at all is `lost`."""
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": OUTPUT_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream, "seed": index}  # fmt: skip
    started = time.monotonic()
    try:
        response = await client.post("/v1/completions", json=body)
    except httpx.HTTPError as exc:
        return Outcome("lost", None, time.monotonic() - started, f"{type(exc).__name__}: {exc}")
    kind, detail = classify(response.status_code, response.headers, response.text, stream)
    return Outcome(kind, response.status_code, time.monotonic() - started, detail)


async def open_loop(base_url: str, rate_rps: float, count: int, seed: int) -> tuple[list[Outcome], float]:
    """`count` requests at Poisson arrivals of `rate_rps`; returns the outcomes and the seconds it took to send."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=2 * count, max_keepalive_connections=2 * count)
    timeout = httpx.Timeout(TIMEOUT_S + 20.0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        start, at, tasks = time.monotonic(), 0.0, []
        for i in range(count):
            at += rng.expovariate(rate_rps)
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            tasks.append(asyncio.create_task(one_request(client, i, stream=i % 4 == 0)))
        sending = time.monotonic() - start
        return list(await asyncio.gather(*tasks)), sending


def calm_latencies(server: ServerProcess, n: int) -> list[float]:
    """End-to-end seconds of n requests sent one after another."""
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True}
    out = []
    for _ in range(n):
        started = time.monotonic()
        response = httpx.post(server.url("/v1/completions"), json=body, timeout=30)
        assert response.status_code == 200, response.text
        out.append(time.monotonic() - started)
    return out


def requests_by_status(server: ServerProcess) -> Counter[str]:
    """The server's own count of finished completions requests by HTTP status."""
    counts: Counter[str] = Counter()
    for line in httpx.get(server.url("/metrics"), timeout=10).text.splitlines():
        if line.startswith('servegate_requests_total{endpoint="completions"'):
            counts[line.split('status="')[1].split('"')[0]] += int(float(line.rsplit(" ", 1)[1]))
    return counts


@pytest.mark.parametrize(
    ("max_requests", "max_burst_s"),
    [pytest.param(240, 20.0, id="fast"), pytest.param(2000, 55.0, id="long", marks=pytest.mark.slow)],
)
def test_four_times_predicted_capacity(tmp_path: Path, figures: Any, max_requests: int, max_burst_s: float) -> None:
    data = overload_manifest(tmp_path)
    served = ServedModel.model_validate(data)
    capacity, fit = predicted_capacity_rps(served)
    rate = OVERLOAD_FACTOR * capacity
    count = max(40, min(max_requests, int(rate * max_burst_s)))
    server = start_server(tmp_path / "server", data, step_delay_s=STEP_DELAY_S)
    try:
        server.wait_ready()
        before = calm_latencies(server, 6)
        counted_before = requests_by_status(server)
        rss_before = rss_bytes(server.pid)
        with RssSampler(server.pid) as rss:
            outcomes, sending_s = asyncio.run(open_loop(server.base_url, rate, count, seed=7))
        alive_after_burst = server.process.is_alive()
        counted = requests_by_status(server) - counted_before
        after = calm_latencies(server, 6)
        ready = httpx.get(server.url("/ready"), timeout=10).status_code
    finally:
        assert server.stop() == 0, server.log()[-3000:]
    kinds = Counter(o.kind for o in outcomes)
    figures.set("engine", "gate serve's app + ReferenceEngine (continuous, batch 4, queue 8), steps +20 ms")
    figures.set("predicted capacity (requests/s)", round(capacity, 2))
    figures.set("offered rate (requests/s)", round(count / sending_s, 2))
    figures.set("burst length (s)", round(sending_s, 2))
    for kind in ("completed", "rejected", "timed_out", "lost", "wrong"):
        figures.count(kind if kind != "wrong" else "wrong outcomes", kinds.get(kind, 0))
    figures.count("sent", len(outcomes))
    figures.count("accepted (not rejected)", kinds["completed"] + kinds["timed_out"])
    figures.set("server count by status", dict(sorted(counted.items())))
    peak = max(rss.samples, default=rss_before)
    figures.set("RSS before / peak / growth (MiB)", f"{rss_before / 2**20:.0f} / {peak / 2**20:.0f} / "
                f"{(peak - rss_before) / 2**20:.1f}")  # fmt: skip
    figures.timings("e2e of completed requests", [o.seconds for o in outcomes if o.kind == "completed"])
    figures.timings("time to a 429", [o.seconds for o in outcomes if o.kind == "rejected"])
    figures.timings("calm e2e before the burst", before)
    figures.timings("calm e2e after the burst", after)

    wrong = [o for o in outcomes if o.kind in ("wrong", "lost")]
    assert not wrong, wrong[:5]
    assert len(outcomes) == count == sum(kinds.values())
    assert kinds["rejected"] > 0 and kinds["completed"] > 0, kinds
    assert alive_after_burst and ready == 200
    # the server counted each request once, with the status its client saw
    assert dict(counted) == dict(Counter(str(o.status) for o in outcomes)), (counted, kinds)
    assert rss.samples and peak - rss_before < 256 * 2**20  # bounded: no per-request growth
    assert statistics.median(after) <= 1.5 * statistics.median(before) + 0.05, (before, after)
    assert fit["steps timed"] > 0
