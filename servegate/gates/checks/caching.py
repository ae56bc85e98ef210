"""The `caching` gate: caches must never change an answer, serve a stale entry, or cross tenants.

On one fresh engine: a control tenant sends the probes twice (cold, then warm; the warm pass asks for
one more token so the response cache misses and the prefix cache is exercised), then tenant A sends
them, then tenant B. With per-tenant scope B gets exactly the hits the control tenant got from its own
probes on a cold cache; anything more came from A. A second engine with a fingerprinted field changed
must get no hits from the first's entries.

On a remote (the endpoint backend) the prefix hits are those its usage reports
(`prompt_tokens_details.cached_tokens`), and one remote serves every pass: a prefix hit after the seed
changed is right (a prompt's KV does not depend on it), and with `tenant_from: none` no tenant is told
apart, so B's hits on A's entries are expected. Timing audits cover what no counter shows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from servegate.contracts.diff import GATE_WATCHES
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.measurements import CachingMeasurements
from servegate.contracts.report.probes import TimingAudits
from servegate.gates.audits.timing_audits import audit_checks, run_timing_audits
from servegate.gates.base import Gate, GateContext
from servegate.gates.registry import register_gate
from servegate.gates.result import GateResult, Verdict, example
from servegate.gates.suites.evaluation import ItemOutput, SuiteData, SuiteItem, generate, probe_items, requests_for
from servegate.runtime.engine.interface import Engine
from servegate.runtime.types import GenerationRequest

PROBES_PER_SUITE = 8
CONTROL, TENANT_A, TENANT_B = "servegate-control", "servegate-tenant-a", "servegate-tenant-b"


def shared_across_tenants(served: ServedModel) -> list[str]:
    """The caches a manifest shares across tenants (global scope), by field."""
    shared = []
    kv = served.runtime.kv_cache
    if kv is not None and kv.prefix_caching and kv.cache_scope == "global":
        shared.append("runtime.kv_cache.cache_scope: global")
    rc = served.postprocess.response_cache
    if rc.enabled and rc.scope == "global":
        shared.append("postprocess.response_cache.scope: global")
    return shared


def caches_enabled(served: ServedModel) -> list[str]:
    """Which caches a manifest turns on."""
    kv = served.runtime.kv_cache
    out = ["prefix cache"] if kv is not None and kv.prefix_caching else []
    return out + (["response cache"] if served.postprocess.response_cache.enabled else [])


def _requests(probes: list[tuple[SuiteData, SuiteItem]], tenant: str, extra_tokens: int = 0) -> list[GenerationRequest]:
    out = []
    for data, item in probes:
        (request,) = requests_for(data, [item], tenant=tenant)
        if extra_tokens:
            request.params = replace(request.params, max_tokens=request.params.max_tokens + extra_tokens)
        request.id = f"{tenant}/{request.id}"
        out.append(request)
    return out


def _pass(engine: Engine, requests: list[GenerationRequest]) -> tuple[list[ItemOutput], int, int]:
    """Outputs, prefix-cache hits and response-cache hits of one pass over the probes."""
    before = engine.stats()
    results = generate(engine, requests)
    after = engine.stats()
    outputs = [ItemOutput.from_result(r.id, res) for r, res in zip(requests, results, strict=True)]
    prefix_hits = after.prefix_cache_hits - before.prefix_cache_hits
    response_hits = max(after.response_cache_hits - before.response_cache_hits, sum(o.cached for o in outputs))
    return outputs, prefix_hits, response_hits


def _same_greedy(cold: ItemOutput, warm: ItemOutput) -> bool:
    """Warm output equals cold; when the cold one stopped at its length cap, the warm one may run longer."""
    if cold.error or warm.error:
        return cold.error == warm.error
    if cold.finish_reason == "length":
        return warm.token_ids[: len(cold.token_ids)] == cold.token_ids
    return warm.token_ids == cold.token_ids


def _timing_note(audits: TimingAudits | None) -> str:
    """What the tenant timing audit adds to a scope failure: that a client can time the leak too."""
    found = audits.isolation if audits is not None else None
    return f"; timing shows it: {found.reason}" if found is not None and found.finding == "shared" else ""


@register_gate(
    "caching",
    watches=GATE_WATCHES["caching"],
    purpose="Prefix and response caches change no answer, serve nothing stale, and leak nothing across tenants.",
)
class CachingGate(Gate):
    """Warm vs cold outputs, stale hits after a fingerprint change, cross-tenant probes, declared scope."""

    def run(self, ctx: GateContext) -> GateResult:
        """Probe a fresh engine of the candidate (without its fallback) as described in the module doc."""
        served = ctx.candidate.with_changes(
            failure_policy={**ctx.candidate.failure_policy.model_dump(mode="python"), "fallback": None}
        )
        enabled = caches_enabled(served)
        tenants = served.preprocess.tenant_from != "none"
        shared = shared_across_tenants(served)
        measurements = CachingMeasurements(caches=enabled, tenants_identified=tenants, shared_across_tenants=shared)
        probes = probe_items(ctx.suites(), PROBES_PER_SUITE)
        if not enabled and not served.runtime.remote:
            return self.result("pass", "no prefix or response cache is enabled", measurements)
        if not probes:
            return self.result("warn", "no eval suites declared: no probes to send", measurements)
        if not enabled:  # a remote's own caches are invisible but for their timing
            audits = run_timing_audits(ctx, served, probes)
            return self._timed_only(measurements.updated(timing_audits=audits), audits)
        ctx.progress.start("caching: probes", 5)
        engine = ctx.engines.fresh(served)
        cold, self_hits, cold_response = _pass(engine, _requests(probes, CONTROL))
        ctx.progress.advance()
        warm, warm_hits, _ = _pass(engine, _requests(probes, CONTROL, extra_tokens=1))
        ctx.progress.advance()
        repeat, _, repeat_response = _pass(engine, _requests(probes, CONTROL))
        ctx.progress.advance()
        _pass(engine, _requests(probes, TENANT_A))
        probe_b, b_hits, b_response = _pass(engine, _requests(probes, TENANT_B))
        ctx.progress.advance()
        changed = served.with_changes(
            runtime={**served.runtime.model_dump(mode="python"), "seed": served.runtime.seed + 1}
        )
        other, stale_hits, stale_response = _pass(ctx.engines.fresh(changed), _requests(probes, CONTROL))
        ctx.progress.advance()

        problems: list[str] = []
        evidence: list[dict[str, Any]] = []
        k = ctx.candidate.quality.max_failure_examples
        for (data, item), c, w, r, o in zip(probes, cold, warm, repeat, other, strict=True):
            for label, got in (("warm prefix cache", w), ("response cache", r), ("fingerprint-changed engine", o)):
                if not _same_greedy(c, got):
                    problems.append(f"{label} changed the output of {data.name}/{item.id}")
                    if len(evidence) < k:
                        evidence.append(
                            example(item.id, data.suite.public, suite=data.name, prompt=item.prompt,
                                    baseline=c.text, candidate=got.text, cache=label)
                        )  # fmt: skip
        remote = served.runtime.remote
        # a remote told of no tenant (tenant_from: none) shares its prefix cache by design: nobody to keep apart
        leaked = (b_hits - self_hits if tenants or not remote else 0) + b_response
        # one remote serves every pass, and a prompt's KV does not depend on the seed: there a prefix hit after the
        # seed changed is a right hit, not a stale one (a fresh reference engine starts with an empty cache)
        stale = (0 if remote else stale_hits - self_hits) + stale_response
        audits = run_timing_audits(ctx, served, probes)  # what a client can time, on any backend
        measurements = measurements.updated(
            probes=len(probes),
            cold_prefix_hits=self_hits,
            warm_prefix_hits=warm_hits,
            repeat_response_hits=repeat_response,
            tenant_b_extra_hits=leaked,
            stale_hits_after_fingerprint_change=stale,
            output_mismatches=len(problems),
            timing_audits=audits,
        )
        return self._verdict(served, measurements, audits, problems, evidence)

    def _verdict(
        self,
        served: ServedModel,
        m: CachingMeasurements,
        audits: TimingAudits,
        problems: list[str],
        evidence: list[dict[str, Any]],
    ) -> GateResult:
        """The worst finding first: changed outputs, a leak across tenants, stale hits; then what went unexercised.

        `audits` are the timing audits `m` holds (`audit_checks` says what each found).
        """
        shared, leaked = m.shared_across_tenants, m.tenant_b_extra_hits or 0
        stale = m.stale_hits_after_fingerprint_change or 0
        warm_hits, repeat_response = m.warm_prefix_hits or 0, m.repeat_response_hits or 0
        if problems:
            return self.result("fail", f"caching changed outputs: {problems[0]} ({len(problems)} total)", m, evidence)
        if shared and m.tenants_identified:
            return self.result(
                "fail",
                f"tenants are identified (preprocess.tenant_from: {served.preprocess.tenant_from}) but "
                f"{' and '.join(shared)}: tenants would see each other's entries and timing "
                f"(tenant B got {leaked} hit(s) from tenant A's probes{_timing_note(audits)})",
                m,
            )
        if leaked > 0 and not shared:
            return self.result(
                "fail",
                f"tenant B got {leaked} cache hit(s) from tenant A's entries although the cache scope is per tenant",
                m,
            )
        if stale > 0:
            return self.result("fail", f"{stale} stale cache hit(s) after a fingerprinted field changed", m)
        timed = audit_checks(audits)
        failed = [r for v, r in timed if v == "fail"]
        if failed:
            return self.result("fail", failed[0], m)
        repeats = audits.response_cache
        if repeats is not None and repeats.finding == "cache_ignores_seed":  # no counter sees it, on any backend
            return self.result(repeats.verdict, f"response-cache timing: {repeats.reason}", m)
        if warm_hits == 0 and repeat_response == 0:
            return self.result("warn", "the warm passes never hit a cache: warm-vs-cold equality was not exercised", m)
        checked = (
            f"warm == cold on {m.probes} probes ({warm_hits} prefix, {repeat_response} response hits), "
            "no cross-tenant or stale hits"
        )
        isolation = audits.isolation
        if served.runtime.remote and "prefix cache" in m.caches:  # its hits are counted inside the remote
            if warm_hits > 0 and not m.tenants_identified:  # its usage said them: prompt_tokens_details
                return self.result(
                    "pass",
                    f"{checked}; the remote's usage reports its prefix-cache hits, and with preprocess.tenant_from: "
                    "none there is no tenant scope to verify",
                    m,
                )
            if isolation is not None and isolation.finding == "isolated":
                verified = m.updated(prefix_cache_observable=False)
                return self.result("pass", f"{checked}; the remote's {isolation.reason}", verified)
            note = f" ({isolation.reason})" if isolation is not None else ""
            return self.result(
                "warn",
                f"{checked}; the remote's prefix cache is declared, not verified: its hits and tenant scope are not "
                f"visible from outside (servegate salts it per tenant on vLLM){note}",
                m.updated(prefix_cache_observable=False),
            )
        warned = [r for v, r in timed if v == "warn"]
        problem = audits.problem is not None
        if warned and (served.runtime.remote or problem):  # on the reference the counters above decided
            return self.result("warn", f"{checked}; {warned[0]}", m)
        if served.postprocess.response_cache.enabled and repeat_response == 0 and warned:
            return self.result("warn", f"{checked}; {warned[0]}", m)
        if shared:  # safe today, one field away from a leak: whoever adds tenants must change the scope too
            return self.result(
                "warn",
                f"{' and '.join(shared)}: every requester shares cache entries and can time them; safe only while "
                f"the deployment has a single tenant (preprocess.tenant_from: none); {checked}",
                m,
            )
        return self.result("pass", checked, m)

    def _timed_only(self, m: CachingMeasurements, audits: TimingAudits) -> GateResult:
        """A remote that declares no cache: only timing can show one it has anyway."""
        checks = audit_checks(audits)
        for wanted in ("fail", "warn"):
            found = [r for v, r in checks if v == wanted]
            if found:
                verdict: Verdict = wanted
                return self.result(verdict, found[0], m)
        reasons = "; ".join(r for _, r in checks) or "no audit ran"
        return self.result("pass", f"no cache is declared and none shows in timing: {reasons}", m)
