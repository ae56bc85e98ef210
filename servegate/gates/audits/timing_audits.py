"""The caching gate's two timing audits, run on one in-process server over HTTP: what a client can time.

The same code runs for `runtime.backend: reference` and for an endpoint (servegate's gateway in front of the
remote), so a cache inside a vLLM or SGLang deployment, invisible to servegate's counters, is still found.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any

from servegate.capacity.bench.own_server import manifest_tokenizer
from servegate.contracts.manifest import ServedModel
from servegate.gates.audits.cache_audit import RepeatTiming, detect_response_cache
from servegate.gates.audits.tenant_audit import TenantTiming, audit_tenants
from servegate.gates.audits.unseen_prompts import UnseenPrompts
from servegate.gates.base import GateContext
from servegate.gates.probes.http_probe import ProbeError, served_over_http
from servegate.gates.result import Verdict
from servegate.gates.suites.evaluation import SuiteData, SuiteItem

AUDIT_TENANTS = ("servegate-audit-a", "servegate-audit-b")


@dataclass(frozen=True)
class TimingAudits:
    """The response-cache detector and the tenant isolation audit, each None when it did not run (and why)."""

    response_cache: RepeatTiming | None
    tenant_isolation: TenantTiming | None
    not_run: tuple[str, ...] = ()
    """Why an audit did not run."""
    problem: str | None = None
    """Why the audits stopped (a request that failed), when they did."""

    def checks(self) -> list[tuple[Verdict, str]]:
        """(verdict, reason) of each audit that ran."""
        out: list[tuple[Verdict, str]] = [("warn", f"timing audits stopped: {self.problem}")] if self.problem else []
        if self.response_cache is not None:
            out.append((self.response_cache.verdict, f"response-cache timing: {self.response_cache.reason}"))
        if self.tenant_isolation is not None:
            out.append((self.tenant_isolation.verdict, f"tenant timing: {self.tenant_isolation.reason}"))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON form kept in the caching gate's measurements."""
        return {
            "response_cache": None if self.response_cache is None else asdict(self.response_cache),
            # not `tenant_...`: the note's public filter drops every non-numeric value under a key naming tenants
            "isolation": None if self.tenant_isolation is None else asdict(self.tenant_isolation),
            "not_run": list(self.not_run),
            "problem": self.problem,
        }


def run_timing_audits(ctx: GateContext, served: ServedModel, probes: list[tuple[SuiteData, SuiteItem]]) -> TimingAudits:
    """Serve `served` on a fresh engine and run the response-cache detector, then (with tenants) the tenant audit."""
    config = ctx.candidate.quality.cache_audit
    if not config.enabled:
        return TimingAudits(None, None, ("quality.cache_audit.enabled is false",))
    if served.preprocess.task != "generate":
        return TimingAudits(None, None, (f"preprocess.task is {served.preprocess.task}: no completions to time",))
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
        return TimingAudits(repeats, isolation, not_run, problem="; ".join(problems) or None)

    try:
        return asyncio.run(audits())
    except ProbeError as exc:  # the audit server never came up: no timing at all, say so, do not guess
        return TimingAudits(None, None, not_run, problem=str(exc))
