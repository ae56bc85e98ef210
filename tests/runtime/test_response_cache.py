"""Response cache: keys (fingerprint, tenant scope, every parameter), TTL, LRU, what is never cached."""

from __future__ import annotations

import dataclasses

from servegate.contracts.sections import ResponseCache as Config
from servegate.runtime.response_cache import ResponseCache
from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams, Usage


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ask(rid: str = "1", tenant: str | None = "a", prompt: str = "hi", **params: object) -> GenerationRequest:
    return GenerationRequest(rid, prompt=prompt, tenant=tenant, params=SamplingParams(**params))


def result(text: str = "out", **kw: object) -> FinishEvent:
    return FinishEvent("x", text, (1, 2), "length", Usage(2, 2), **kw)


def test_a_hit_returns_the_result_marked_cached_under_the_new_id() -> None:
    cache = ResponseCache(Config(enabled=True), "fp")
    assert cache.get(ask()) is None
    cache.put(ask(), result())
    hit = cache.get(ask(rid="2"))
    assert hit is not None and hit.cached and hit.request_id == "2" and hit.text == "out"
    assert (cache.hits, cache.misses) == (1, 1)


def test_the_key_covers_fingerprint_tenant_prompt_and_parameters() -> None:
    cache = ResponseCache(Config(enabled=True), "fp")
    base = cache.key(ask())
    assert ResponseCache(Config(enabled=True), "other-fp").key(ask()) != base
    assert cache.key(ask(tenant="b")) != base
    assert cache.key(ask(prompt="hi!")) != base
    assert cache.key(ask(temperature=0.5)) != base
    assert cache.key(ask(stop=("x",))) != base
    assert cache.key(ask(rid="other")) == base  # the request id is not part of the request's content
    shared = ResponseCache(Config(enabled=True, scope="global"), "fp")
    assert shared.key(ask(tenant="a")) == shared.key(ask(tenant="b"))


def test_entries_expire_after_their_ttl() -> None:
    clock = Clock()
    cache = ResponseCache(Config(enabled=True, ttl_s=10), "fp", clock=clock)
    cache.put(ask(), result())
    clock.now = 9.5
    assert cache.get(ask()) is not None
    clock.now = 10.5
    assert cache.get(ask()) is None and len(cache) == 0


def test_the_least_recently_used_entry_goes_first() -> None:
    cache = ResponseCache(Config(enabled=True, max_entries=2), "fp")
    for prompt in ("a", "b"):
        cache.put(ask(prompt=prompt), result(prompt))
    assert cache.get(ask(prompt="a")) is not None  # "b" is now the least recently used
    cache.put(ask(prompt="c"), result("c"))
    assert cache.get(ask(prompt="b")) is None
    assert cache.get(ask(prompt="a")).text == "a" and cache.get(ask(prompt="c")).text == "c"


def test_fallback_results_are_never_cached_as_the_primarys() -> None:
    cache = ResponseCache(Config(enabled=True), "fp")
    cache.put(ask(), dataclasses.replace(result(), fallback_used=True))
    assert cache.get(ask()) is None
