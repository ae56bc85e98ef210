"""The bench against servers whose delays are known: it must recover them and never hide queueing."""

from __future__ import annotations

import asyncio

import pytest
from support.synthetic_server import Delays, SyntheticServer

from servegate.capacity.bench.load_generator import run_bench
from servegate.capacity.bench.local_server import free_port
from servegate.capacity.bench.plots import write_plots
from servegate.capacity.bench.run_metrics import SLO
from servegate.capacity.bench.targets import HttpTarget, PromptFactory
from servegate.contracts.capacity_section import LengthDistribution, Workload


def workload(**kw: object) -> Workload:
    base = {"input_tokens": LengthDistribution(mean=8, max=8), "output_tokens": LengthDistribution(mean=6, max=8)}
    return Workload.model_validate({**base, **kw})


def bench(url: str, wl: Workload, **kw: object):  # noqa: ANN201
    async def go():  # noqa: ANN202
        target = HttpTarget(url, model="m")
        await target.probe()
        try:
            return await run_bench(target, wl, PromptFactory(), **kw)
        finally:
            await target.aclose()

    return asyncio.run(go())


def test_recovers_known_ttft_and_inter_token_delays() -> None:
    with SyntheticServer(Delays(ttft_ms=40, itl_ms=10)) as server:
        report = bench(server.url, workload(rate_rps=10, num_requests=30)).as_dict()
    assert report["requests"]["completed"] == 30
    assert 40 <= report["ttft_ms"]["p50"] <= 48
    assert 9 <= report["itl_ms"]["p50"] <= 12
    assert 9 <= report["tpot_ms"]["p50"] <= 12
    # 40 ms to the first token, then 5 more tokens 10 ms apart
    assert 90 <= report["e2el_ms"]["p50"] <= 100
    assert report["throughput"]["output_tokens_per_s"] == pytest.approx(6 * report["throughput"]["requests_per_s"])


def test_each_record_keeps_the_id_its_response_streamed_back() -> None:
    from servegate.capacity.bench.load_generator import run_once

    async def go():  # noqa: ANN202
        target = HttpTarget(server.url, model="m")
        try:
            return await run_once(target, workload(rate_rps=50, num_requests=4), PromptFactory())
        finally:
            await target.aclose()

    with SyntheticServer(Delays(ttft_ms=2, itl_ms=1)) as server:
        run = asyncio.run(go())
    ids = [r.request_id for r in run.records]
    assert all(isinstance(i, str) and i.startswith("cmpl-synthetic-") for i in ids) and len(set(ids)) == 4


def test_open_loop_shows_queueing_that_a_closed_loop_hides() -> None:
    # one request at a time, 20 ms each: capacity 50 requests/s; offered 100 requests/s for 40 requests
    one_slot = Delays(ttft_ms=20, itl_ms=0, slots=1)
    with SyntheticServer(one_slot) as server:
        opened = bench(server.url, workload(rate_rps=100, num_requests=40, output_tokens={"mean": 1, "max": 1}))
        closed = bench(server.url, workload(arrival="closed", concurrency=1, num_requests=20,
                                            output_tokens={"mean": 1, "max": 1}))  # fmt: skip
    o, c = opened.as_dict(), closed.as_dict()
    assert 19 <= c["e2el_ms"]["p50"] <= 30  # the closed loop only ever sees the service time
    # the 40th request is scheduled at ~0.39 s but served last, at ~0.8 s: its wait is in its latency
    assert o["e2el_ms"]["p99"] > 250
    assert o["throughput"]["requests_per_s"] < 55  # never more than the server can do, whatever was offered


def test_repeats_report_an_interval_and_goodput_uses_the_slo() -> None:
    with SyntheticServer(Delays(ttft_ms=5, itl_ms=2)) as server:
        report = bench(server.url, workload(rate_rps=40, num_requests=15), repeats=3, slo=SLO(e2el_ms=1.0)).as_dict()
    assert len(report["runs"]) == 3
    interval = report["across_runs"]["e2el_ms"]["p50"]
    assert interval["runs"] == 3 and interval["low"] <= interval["mean"] <= interval["high"]
    assert report["goodput"]["requests_per_s"] == 0.0  # nobody finishes within 1 ms
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert set(report[key]) >= {"mean", "p50", "p95", "p99"}


def test_rate_sweep_and_plots(tmp_path) -> None:
    with SyntheticServer(Delays(ttft_ms=2, itl_ms=1)) as server:
        result = bench(server.url, workload(rate_rps=10, num_requests=8), rates=[20.0, 40.0])
    assert [r.rate_rps for r in result.runs] == [20.0, 40.0]
    paths = write_plots(result, tmp_path / "plots")
    assert sorted(p.name for p in paths) == ["latency_cdf.png", "rate_curves.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_unreachable_server_fails_the_probe_with_a_message() -> None:
    with pytest.raises(ConnectionError, match="probe"):
        bench(f"http://127.0.0.1:{free_port()}/v1", workload(rate_rps=1, num_requests=1))


def test_requests_carry_the_tenant_the_manifest_reads() -> None:
    from servegate.contracts.manifest import ServedModel

    served = ServedModel.model_validate(
        {"name": "m", "weights": {"source": "zoo:tiny-primary"}, "preprocess": {"tenant_from": "header"}}
    )
    with SyntheticServer(Delays()) as server:

        async def go() -> None:
            target = HttpTarget.for_manifest(server.url, served)
            await target.probe()
            await target.aclose()

        asyncio.run(go())
        assert server.last_headers.get("x-tenant") == "bench"
    by_user = served.with_changes(preprocess={"tenant_from": "user"})
    assert HttpTarget.for_manifest("http://h/v1", by_user).body("p", 1)["user"] == "bench"


def test_the_report_says_how_fast_this_machine_ran_in_the_bench_and_in_each_run() -> None:
    from servegate.cli.bench import machine_lines

    with SyntheticServer(Delays(ttft_ms=5, itl_ms=2)) as server:
        report = bench(server.url, workload(rate_rps=40, num_requests=15), repeats=2).as_dict()
        unmonitored = bench(server.url, workload(rate_rps=40, num_requests=5), monitor_machine=False).as_dict()
    speed = report["machine_speed"]
    assert speed["probe_us"] > 0 and speed["samples"] >= 2 and isinstance(speed["steady"], bool)
    assert all(run["machine_speed"]["probe_us"] > 0 for run in report["runs"])
    lines = machine_lines(report)
    assert lines[0].startswith("this machine during the bench: a 5,000-step Python loop took")
    assert lines[1].startswith("  loop median per run: ")
    assert ("repeat on a steady machine" in lines[-1]) == (not speed["steady"])
    assert "machine_speed" not in unmonitored and machine_lines(unmonitored) == []
