"""Prometheus metrics of one server, in its own CollectorRegistry (two apps in one process never collide).

Labels are closed sets (endpoint, HTTP status, outcome): no request text and no tenant id ever becomes a
label value, so the exported series cannot leak what users sent or who they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from servegate.runtime.types import EngineStats, FinishEvent

# Latency buckets in seconds, from a cached tiny-model token (~1 ms) to a long CPU generation (~2 min).
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _EngineCollector(Collector):
    """Reads the engine's live counters at scrape time (no copy to keep in sync)."""

    def __init__(self, stats: Callable[[], EngineStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        if stats is None:
            return
        gauges = {
            "servegate_queue_depth": ("Requests waiting to be scheduled.", stats.queue_depth),
            "servegate_running_sequences": ("Sequences being generated.", stats.running),
            "servegate_kv_blocks_used": ("KV cache blocks in use.", stats.kv_blocks_used),
            "servegate_kv_blocks_free": ("KV cache blocks free.", stats.kv_blocks_free),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        counters = {
            "servegate_prefix_cache_hits": (
                "Prompt prefixes served from the KV prefix cache.",
                stats.prefix_cache_hits,
            ),
            "servegate_prefix_cache_misses": (
                "Prompt prefixes not found in the prefix cache.",
                stats.prefix_cache_misses,
            ),
            "servegate_response_cache_hits": ("Requests answered from the response cache.", stats.response_cache_hits),
            "servegate_fallback_uses": ("Requests answered by the fallback model.", stats.fallback_uses),
            "servegate_preemptions": (
                "Sequences preempted (recomputed later) for lack of KV blocks.",
                stats.preemptions,
            ),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)


class ServerMetrics:
    """The server's metrics: request counts by endpoint and status, latency histograms, token counts."""

    def __init__(self, stats: Callable[[], EngineStats | None]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "servegate_requests", "Finished HTTP requests by endpoint and status.", ["endpoint", "status"], registry=r
        )
        self.in_flight = Gauge("servegate_requests_in_flight", "HTTP requests being served.", registry=r)
        self.ready = Gauge(
            "servegate_ready", "1 when the model is loaded, warm-up passed and not draining.", registry=r
        )
        self.ttft = Histogram(
            "servegate_time_to_first_token_seconds",
            "Seconds from arrival to the first output token.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "servegate_time_per_output_token_seconds",
            "Seconds per output token after the first.",
            ["endpoint"],
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "servegate_e2e_request_latency_seconds",
            "Seconds from arrival to the last byte of the response.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("servegate_prompt_tokens", "Prompt tokens processed.", ["endpoint"], registry=r)
        self.completion_tokens = Counter(
            "servegate_completion_tokens", "Completion tokens generated.", ["endpoint"], registry=r
        )
        self.truncated_tokens = Counter(
            "servegate_truncated_tokens", "Prompt tokens dropped by the truncation policy.", ["endpoint"], registry=r
        )
        r.register(_EngineCollector(stats))
        # process_resident_memory_bytes and friends: the model lives in this process, so its resident memory
        # is the deployment's, which an endpoint manifest in front of this server checks its budget against
        ProcessCollector(registry=r)

    def request_done(self, endpoint: str, status: int) -> None:
        """Count one finished request."""
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def generation_done(self, endpoint: str, finish: FinishEvent, ttft_s: float | None, e2e_s: float) -> None:
        """Record the latencies and token counts of one finished generation."""
        usage = finish.usage
        self.prompt_tokens.labels(endpoint).inc(usage.prompt_tokens)
        self.completion_tokens.labels(endpoint).inc(usage.completion_tokens)
        if usage.truncated_tokens:
            self.truncated_tokens.labels(endpoint).inc(usage.truncated_tokens)
        self.e2e.labels(endpoint).observe(e2e_s)
        if ttft_s is not None:
            self.ttft.labels(endpoint).observe(ttft_s)
            if usage.completion_tokens > 1:
                self.tpot.labels(endpoint).observe(max(0.0, e2e_s - ttft_s) / (usage.completion_tokens - 1))

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)
