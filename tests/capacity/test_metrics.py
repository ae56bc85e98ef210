"""Metric definitions on a synthetic event trace whose percentiles are computed by hand."""

from __future__ import annotations

import pytest

from servegate.capacity.bench.run_metrics import SLO, RequestRecord, percentile, summarize


def trace() -> list[RequestRecord]:
    return [
        # scheduled at 0: tokens at 100, 120, 140, 160 ms, response ends at 170 ms
        RequestRecord(0.0, 0.0, [0.100, 0.120, 0.140, 0.160], 0.170, output_tokens=4),
        # scheduled at 1 s but sent late (the client fell behind): latency still counts from 1 s
        RequestRecord(1.0, 1.150, [1.200, 1.250], 1.250, output_tokens=2),
        RequestRecord(2.0, 2.0, [2.050], 2.060, output_tokens=1),
        RequestRecord(3.0, 3.0, [], 3.5, error="overloaded"),
    ]


def test_latencies_count_from_the_scheduled_send_time() -> None:
    s = summarize(trace())
    # TTFT 100, 200, 50 ms -> sorted 50, 100, 200; p95 at rank 0.95 * 2 = 1.9 -> 100 + 0.9 * 100
    assert s["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert s["ttft_ms"]["p95"] == pytest.approx(190.0)
    assert s["ttft_ms"]["p99"] == pytest.approx(198.0)
    assert s["ttft_ms"]["mean"] == pytest.approx(350.0 / 3)
    # E2EL 170, 250, 60 -> p95 = 170 + 0.9 * 80
    assert s["e2el_ms"]["p50"] == pytest.approx(170.0)
    assert s["e2el_ms"]["p95"] == pytest.approx(242.0)
    assert s["max_send_lag_ms"] == pytest.approx(150.0)


def test_tpot_excludes_the_first_token_and_single_token_outputs() -> None:
    s = summarize(trace())
    # (170 - 100) / 3 and (250 - 200) / 1; the one-token request has no TPOT
    assert s["tpot_ms"]["count"] == 2
    assert s["tpot_ms"]["mean"] == pytest.approx((70 / 3 + 50) / 2)
    assert s["tpot_ms"]["p50"] == pytest.approx((70 / 3 + 50) / 2)


def test_itl_pools_every_gap_between_chunks() -> None:
    s = summarize(trace())
    # gaps 20, 20, 20 (first request) and 50 (second): p95 at rank 2.85 -> 20 + 0.85 * 30
    assert s["itl_ms"]["count"] == 4
    assert s["itl_ms"]["p50"] == pytest.approx(20.0)
    assert s["itl_ms"]["p95"] == pytest.approx(45.5)
    assert s["itl_ms"]["mean"] == pytest.approx(27.5)


def test_throughput_and_goodput() -> None:
    s = summarize(trace(), SLO(e2el_ms=200))
    # three completed requests with 7 output tokens between 0 s and the last completion at 2.06 s
    assert s["throughput"]["requests_per_s"] == pytest.approx(3 / 2.06)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(7 / 2.06)
    assert s["requests"] == {"sent": 4, "completed": 3, "failed": 1}
    # within 200 ms end to end: the first and third; the failed one never counts
    assert s["goodput"]["requests_per_s"] == pytest.approx(2 / 2.06)
    assert s["goodput"]["fraction"] == pytest.approx(0.5)


def test_slo_on_ttft_and_tpot() -> None:
    records = trace()
    assert SLO(ttft_ms=150).met_by(records[0]) and not SLO(ttft_ms=150).met_by(records[1])
    assert not SLO(tpot_ms=30).met_by(records[1]) and SLO(tpot_ms=30).met_by(records[0])
    assert not SLO().met_by(records[3])


def test_percentile_of_nothing_is_nan() -> None:
    assert percentile([], 50) != percentile([], 50)
    assert summarize([])["e2el_ms"]["count"] == 0
