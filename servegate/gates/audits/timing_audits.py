"""The caching gate's two timing audits, run on one in-process server over HTTP: what a client can time.

The same code runs for `runtime.backend: reference` and for an endpoint (servegate's gateway in front of the
remote), so a cache inside a vLLM or SGLang deployment, invisible to servegate's counters, is still found.
"""

from __future__ import annotations

import asyncio

from servegate.capacity.bench.own_server import manifest_tokenizer
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.probes import RepeatTiming, TimingAudits
from servegate.gates.audits.cache_audit import detect_response_cache
from servegate.gates.audits.tenant_audit import audit_tenants
from servegate.gates.audits.unseen_prompts import UnseenPrompts
from servegate.gates.base import GateContext
from servegate.gates.probes.http_probe import ProbeError, served_over_http
from servegate.gates.result import Verdict
from servegate.gates.suites.evaluation import SuiteData, SuiteItem

AUDIT_TENANTS = ("servegate-audit-a", "servegate-audit-b")


def audit_checks(audits: TimingAudits) -> list[tuple[Verdict, str]]:
    """(verdict, reason) of each timing audit that ran, after a warning when the audits stopped."""
    out: list[tuple[Verdict, str]] = [("warn", f"timing audits stopped: {audits.problem}")] if audits.problem else []
    if audits.response_cache is not None:
        out.append((audits.response_cache.verdict, f"response-cache timing: {audits.response_cache.reason}"))
    if audits.isolation is not None:
        out.append((audits.isolation.verdict, f"tenant timing: {audits.isolation.reason}"))
    return out


def run_timing_audits(ctx: GateContext, served: ServedModel, probes: list[tuple[SuiteData, SuiteItem]]) -> TimingAudits:
    """Serve `served` on a fresh engine and run the response-cache detector, then (with tenants) the tenant audit."""
    with ctx.split.phase("timing audits"):
        return _timing_audits(ctx, served, probes)


def _timing_audits(ctx: GateContext, served: ServedModel, probes: list[tuple[SuiteData, SuiteItem]]) -> TimingAudits:
    config = ctx.candidate.quality.cache_audit
    if not config.enabled:
        return TimingAudits(response_cache=None, isolation=None, not_run=("quality.cache_audit.enabled is false",))
    if served.preprocess.task != "generate":
        why = f"preprocess.task is {served.preprocess.task}: no completions to time"
        return TimingAudits(response_cache=None, isolation=None, not_run=(why,))
    tenants = served.preprocess.tenant_from != "none"
    not_run = () if tenants else ("tenant isolation: preprocess.tenant_from is none (a single tenant)",)
    prompts = [(item.prompt, data.suite.max_tokens) for data, item in probes]
    steps = 2 if tenants else 1
    ctx.progress.start("caching: timing audits", steps)
    engine = ctx.engines.fresh(served)  # the pool's: other gates may share its vLLM server, the pool closes it

    async def audits() -> TimingAudits:
        problems: list[str] = []
        unseen = UnseenPrompts(manifest_tokenizer(served))  # None: lengths matched in characters, and said so
        async with served_over_http(served, engine, owns_engine=False) as probe:
            repeats: RepeatTiming | None = None
            try:
                repeats = await detect_response_cache(
                    probe,
                    prompts,
                    config,
                    declared=served.postprocess.response_cache.enabled,
                    tenant=AUDIT_TENANTS[0] if tenants else None,
                    unseen=unseen,
                )
            except ProbeError as exc:  # its probes' answers refused (say, by an output schema): the tenant audit's
                problems.append(f"response-cache timing: {exc}")  # streamed first tokens may still be timed
            ctx.progress.advance()
            isolation = None
            if tenants:
                count = unseen.length if unseen.unit == "tokens" else None
                try:
                    isolation = await audit_tenants(probe, config, tenants=AUDIT_TENANTS, count=count)
                except ProbeError as exc:
                    problems.append(f"tenant timing: {exc}")
                ctx.progress.advance()
        stopped = "; ".join(problems) or None
        return TimingAudits(response_cache=repeats, isolation=isolation, not_run=not_run, problem=stopped)

    try:
        return asyncio.run(audits())
    except ProbeError as exc:  # the audit server never came up: no timing at all, say so, do not guess
        return TimingAudits(response_cache=None, isolation=None, not_run=not_run, problem=str(exc))
