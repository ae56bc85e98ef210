"""Tenants: randomized probes over the prefix cache and the response cache never hit another tenant's entries,
and a tenant cannot tell from latency whether another tenant sent a prompt.

The probes go through the real HTTP app (tenant from X-Tenant or from `user`) to `gate serve`'s engine;
after each one the engine's counters say how many prefix blocks and whole responses came from a cache.
Every hit must be explained by the same tenant's own earlier requests. The timing probe compares, with a
Mann-Whitney U test, the time to first token of prompts another tenant cached against fresh prompts; two
controls show it can see a difference: the tenant's own cache hits, and a deployment with global scope.
The caching gate's verdicts on the fake engine are tests/gates/test_gates.py; here they run on the real one.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from pathlib import Path
from typing import Any

import httpx
import pytest
from reliability_engine import MODEL_NAME, manifest_data, model_source, reference_engine
from scipy.stats import mannwhitneyu

from servegate.contracts.manifest import ServedModel
from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams
from servegate.server import create_app
from servegate.server.app import bring_up

pytestmark = pytest.mark.reliability

BLOCK = 8
BASES = ["the launch code is ", "customer ticket 551", "internal memo: eyes", "salary table for q3",
         "hello, how are you ", "please summarise th"]  # fmt: skip
TAILS = ["alpha bravo charlie delta", "echo foxtrot golf hotel x", "india juliet kilo lima yy",
         "mike november oscar papaz"]  # fmt: skip
TENANTS = ["t1", "t2", "t10", "t11", "acme", "ACME", "acme-corp", "a", "b", "tenant with spaces", "x" * 200, "zz"]


def cache_manifest(
    folder: Path, tenant_from: str, scope: str = "tenant", budget: str = "4MiB", **sections: Any
) -> dict[str, Any]:
    """Prefix caching (blocks of 8, a KV pool of `budget`) and the response cache, both with `scope`; tenants
    from `tenant_from`."""
    return manifest_data(
        model_source(folder),
        preprocess={"tenant_from": tenant_from},
        runtime={
            "kv_cache": {"block_size": BLOCK, "memory_budget": budget, "prefix_caching": True, "cache_scope": scope}
        },  # fmt: skip
        postprocess={"response_cache": {"enabled": True, "scope": scope}},
        **sections,
    )


def common_blocks(a: list[int], b: list[int]) -> int:
    """Full blocks two prompts share from the start (at most those before each one's last token)."""
    limit = min((len(a) - 1) // BLOCK, (len(b) - 1) // BLOCK)
    n = 0
    while n < limit and a[n * BLOCK : (n + 1) * BLOCK] == b[n * BLOCK : (n + 1) * BLOCK]:
        n += 1
    return n


async def _probe_over_http(served: ServedModel, probes: list[tuple[str, str, int]], tenant_from: str) -> list[Any]:
    """Send the probes one by one through the app; (prefix hits, response hit) of each, from the engine's counters."""
    engine = reference_engine(served)
    app = create_app(served, engine)
    state = app.state.serving
    await bring_up(state)
    assert state.ready, state.not_ready_reason
    seen: list[tuple[int, bool]] = []
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://servegate") as client:
            for tenant, prompt, max_tokens in probes:
                body: dict[str, Any] = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                                        "temperature": 0}  # fmt: skip
                headers = {"X-Tenant": tenant} if tenant_from == "header" else {}
                if tenant_from == "user":
                    body["user"] = tenant
                before = engine.stats()
                response = await client.post("/v1/completions", json=body, headers=headers)
                assert response.status_code == 200, response.text
                after = engine.stats()
                seen.append((after.prefix_cache_hits - before.prefix_cache_hits,
                             after.response_cache_hits > before.response_cache_hits))  # fmt: skip
        ids = {p: engine.parts.preprocessor.encode(GenerationRequest("x", prompt=p)).token_ids for _, p, _ in probes}
    finally:
        await engine.shutdown(5)
    return [seen, ids]


@pytest.mark.parametrize(
    ("tenant_from", "count"),
    [
        pytest.param("header", 120, id="header-fast"),
        pytest.param("user", 400, id="user-long", marks=pytest.mark.slow),
        pytest.param("header", 400, id="header-long", marks=pytest.mark.slow),
    ],
)
def test_randomized_probes_never_hit_another_tenants_cache(
    tmp_path: Path, figures: Any, tenant_from: str, count: int
) -> None:
    served = ServedModel.model_validate(cache_manifest(tmp_path, tenant_from))
    rng = random.Random(5)
    probes = [(rng.choice(TENANTS), rng.choice(BASES) + rng.choice(TAILS), rng.choice([2, 3])) for _ in range(count)]
    seen, ids = asyncio.run(_probe_over_http(served, probes, tenant_from))

    cross_prefix = cross_response = own_prefix = own_response = opportunities = 0
    for i, ((tenant, prompt, max_tokens), (prefix_hits, response_hit)) in enumerate(zip(probes, seen, strict=True)):
        earlier = probes[:i]
        own = [p for t, p, _ in earlier if t == tenant]
        others = [p for t, p, _ in earlier if t != tenant]
        own_blocks = max((common_blocks(ids[prompt], ids[p]) for p in own), default=0)
        other_blocks = max((common_blocks(ids[prompt], ids[p]) for p in others), default=0)
        own_exact = (tenant, prompt, max_tokens) in earlier
        other_exact = any(p == prompt and m == max_tokens for t, p, m in earlier if t != tenant)
        opportunities += (other_blocks > own_blocks) + (other_exact and not own_exact)
        if response_hit:
            own_response += own_exact
            cross_response += not own_exact
        else:
            own_prefix += min(prefix_hits, own_blocks)
            cross_prefix += max(0, prefix_hits - own_blocks)
    figures.set("path", f"HTTP app (tenant from {tenant_from}) -> gate serve's engine, both caches per tenant")
    figures.count("probes", count)
    figures.count("tenants", len({t for t, _, _ in probes}))
    figures.count("probes another tenant could have served from its entries", opportunities)
    figures.count("own prefix-cache block hits", own_prefix)
    figures.count("own response-cache hits", own_response)
    figures.count("cross-tenant prefix-cache block hits", cross_prefix)
    figures.count("cross-tenant response-cache hits", cross_response)
    assert cross_prefix == 0 and cross_response == 0
    assert opportunities > 10 and own_prefix > 0 and own_response > 0  # the caches worked and leaks were possible


def _ttft(engine: Any, tenant: str, prompt: str) -> tuple[float, int]:
    """Time to first token (engine clock, s) of one greedy 1-token request, and its prefix-cache block hits."""
    before = engine.stats().prefix_cache_hits
    request = GenerationRequest(f"{tenant}/{prompt}", prompt=prompt, params=SamplingParams(max_tokens=1),
                                tenant=tenant)  # fmt: skip
    (result,) = engine.generate([request])
    assert isinstance(result, FinishEvent), result
    return float(result.ttft_s or 0.0), engine.stats().prefix_cache_hits - before


def timing_probe(served: ServedModel, n: int, seed: int) -> dict[str, Any]:
    """Victim tenant A sends n prompts; then, interleaved at random, attacker B sends those same prompts and n
    fresh ones, and A sends n prompts sharing 40 tokens with its own. Time to first token of each group."""
    rng = random.Random(seed)

    def prompt(tag: str, i: int) -> str:
        return f"{tag}{i:03d} " + "".join(rng.choice("abcdefghij") for _ in range(36)) + f" {i:03d}"

    victims = [prompt("V", i) for i in range(n)]
    fresh = [prompt("F", i) for i in range(n)]
    # same first 40 characters as a victim prompt, a different end: A's own prefix-cache hits
    own = [v[:40] + "".join(reversed(v[40:])) + "!" for v in victims]
    engine = reference_engine(served, step_delay_s=0.002, per_token_s=0.0005)
    engine.start_sync()
    try:
        _ttft(engine, "warm-up", "warm the engine up once " * 2)
        for v in victims:
            _ttft(engine, "A", v)
        plan = [("B-victim", "B", v) for v in victims] + [("B-fresh", "B", f) for f in fresh]
        plan += [("A-own", "A", o) for o in own]
        rng.shuffle(plan)
        times: dict[str, list[float]] = {"B-victim": [], "B-fresh": [], "A-own": []}
        hits: dict[str, int] = {"B-victim": 0, "B-fresh": 0, "A-own": 0}
        for group, tenant, text in plan:
            seconds, blocks = _ttft(engine, tenant, text)
            times[group].append(seconds)
            hits[group] += blocks
    finally:
        engine.shutdown_sync(5)
    return {"times": times, "hits": hits}


@pytest.mark.parametrize("n", [pytest.param(25, id="fast"), pytest.param(120, id="long", marks=pytest.mark.slow)])
def test_another_tenants_cached_prompt_is_not_faster(tmp_path: Path, figures: Any, n: int) -> None:
    # a pool that keeps every probe's blocks (3n prompts of ~48 tokens): an evicted entry would make the
    # controls miss, not the attacker (a 4 MiB pool dropped A's entries before its own probes at n=120)
    budget = "32MiB"
    scoped = timing_probe(ServedModel.model_validate(cache_manifest(tmp_path, "header", budget=budget)), n, seed=1)
    # the control leaks through the prefix cache alone (a shared response cache would answer in 0 ms)
    leaky_data = cache_manifest(tmp_path, "header", scope="global", budget=budget)
    leaky_data["postprocess"]["response_cache"]["enabled"] = False
    leaky = timing_probe(ServedModel.model_validate(leaky_data), n, seed=2)
    t, g = scoped["times"], leaky["times"]
    cross = mannwhitneyu(t["B-victim"], t["B-fresh"], alternative="two-sided").pvalue
    own = mannwhitneyu(t["A-own"], t["B-fresh"], alternative="less").pvalue
    leak = mannwhitneyu(g["B-victim"], g["B-fresh"], alternative="less").pvalue
    figures.set("cost model", "steps +2 ms + 0.5 ms per computed token (prefill of 48 tokens ~ 26 ms)")
    for name, values in t.items():
        figures.timings(f"tenant scope: TTFT {name}", values)
    figures.timings("global scope: TTFT B-victim", g["B-victim"])
    figures.timings("global scope: TTFT B-fresh", g["B-fresh"])
    figures.set("p (B on A's prompts vs B fresh, tenant scope; two-sided)", round(float(cross), 4))
    figures.set("p (A's own hits faster than fresh; control)", float(f"{own:.2g}"))
    figures.set("p (B on A's prompts faster, global scope; control)", float(f"{leak:.2g}"))
    figures.count("cross-tenant prefix block hits (tenant scope)", scoped["hits"]["B-victim"])
    figures.count("cross-tenant prefix block hits (global scope; control)", leaky["hits"]["B-victim"])
    median_gap_ms = 1000 * (statistics.median(t["B-victim"]) - statistics.median(t["B-fresh"]))
    figures.set("median TTFT gap B-victim - B-fresh (ms, tenant scope)", round(median_gap_ms, 2))
    assert scoped["hits"]["B-victim"] == 0 and scoped["hits"]["A-own"] > 0 and leaky["hits"]["B-victim"] > 0
    assert own < 1e-3 and leak < 1e-3  # the probe sees a cache hit, its own or (with global scope) A's
    assert cross > 1e-3  # ... and sees no difference between A's prompts and fresh ones under tenant scope


@pytest.mark.parametrize(
    ("tenant_from", "scope", "verdict"),
    [
        ("header", "global", "fail"),
        ("none", "global", "warn"),
        ("header", "tenant", "pass"),
    ],
)
def test_the_caching_gate_on_the_real_engine(
    tmp_path: Path, figures: Any, tenant_from: str, scope: str, verdict: str
) -> None:
    """Global scope with identified tenants fails (tenant B measurably got A's entries); with a single tenant
    it warns; per-tenant scope passes with zero cross-tenant hits."""
    from servegate.gates.check import run_check
    from servegate.gates.suites.output_cache import OutputCache

    suites = [{"name": name, "dataset": f"zoo:{name}", "limit": 8, "public": True} for name in ("arith", "recall")]
    data = cache_manifest(tmp_path, tenant_from, scope=scope, quality={"suites": suites})
    served = ServedModel.model_validate(data)
    report = run_check(served.reference_form(), served, mode="reference", forced=("caching",),
                       cache=OutputCache(tmp_path / "cache"))  # fmt: skip
    (result,) = [g for g in report.gates if g.name == "caching"]
    leaked = getattr(result.measurements, "tenant_b_extra_hits", None)
    figures.set(f"verdict (tenant_from {tenant_from}, scope {scope})", f"{result.verdict}: {result.reason[:90]}")
    figures.set("tenant B hits from A's entries", leaked)
    assert result.verdict == verdict, result.reason
    if scope == "global":
        assert "global" in result.reason
    if tenant_from == "header":
        assert (leaked > 0) == (scope == "global")
