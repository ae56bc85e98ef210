"""The `contract` gate: the served API answers exactly as the manifest's contract and the error catalogue say.

Runs the HTTP app in process (`servegate.server.create_app`, driven through httpx's ASGI transport):
every catalogued error is provoked and must come back with its status, code and param; no probe may
get a 500; valid requests give outputs valid under `output_schema`; streamed text equals non-streamed
text; the same seed gives the same output, measured where draws differ (probes/contract_measure.py). On a remote,
the context it serves is read from its /v1/models or, where it reports none, measured with a prompt at the
declared context. A field that could be neither read nor measured is listed as not verified and the gate
warns. Without the server, the engine-level part runs and the gate warns that the HTTP contract was not
checked.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, cast

import jsonschema

from servegate.contracts.diff import GATE_WATCHES
from servegate.contracts.errors import CATALOGUE
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.measurements import ContractMeasurements, RemoteIdentity
from servegate.gates.base import Gate, GateContext
from servegate.gates.probes.constraint_load import check_constraints
from servegate.gates.probes.contract_measure import (
    CONTEXT_FIELD,
    SEED_TEMPERATURE,
    SEED_TOKENS,
    Draw,
    FieldCheck,
    check_seed,
    context_reported,
    measure_context,
    seed_body,
    seed_prompts,
)
from servegate.gates.probes.contract_probes import (
    COMPLETIONS,
    NOT_PROVOKABLE,
    Probe,
    Variant,
    probes_for,
    tenant_fields,
    tenant_headers,
    variant_manifest,
)
from servegate.gates.probes.http_target import REQUEST_TIMEOUT_S, wait_ready
from servegate.gates.probes.penalty_probe import check_penalties
from servegate.gates.probes.structured_load import check_structured
from servegate.gates.probes.template_probe import check_template
from servegate.gates.probes.tool_load import check_tools
from servegate.gates.registry import register_gate
from servegate.gates.result import GateResult
from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from servegate.runtime.remote.endpoint import EndpointEngine

AppFactory = Callable[[ServedModel, Any], Any]


def default_app_factory() -> AppFactory | None:
    """`servegate.server.create_app` when the server is installed, else None."""
    try:
        from servegate.server import create_app
    except ImportError:
        return None
    return create_app


def _error_of(response: Any) -> tuple[str | None, str | None]:
    try:
        error = response.json().get("error") or {}
    except (ValueError, AttributeError):
        return None, None
    return error.get("code"), error.get("param")


def _check(probe: Probe, responses: list[Any]) -> str | None:
    """None when the responses are what the contract requires, otherwise what went wrong."""
    if any(r.status_code >= 500 and r.status_code not in (502, 503, 504) for r in responses):
        return (
            f"{probe.description}: got HTTP {max(r.status_code for r in responses)} (a client must never cause a 500)"
        )
    allowed = {(probe.status, probe.expect_code), *probe.also}
    matching = [r for r in responses if (r.status_code, _error_of(r)[0]) in allowed]
    if not matching:
        got = ", ".join(sorted({f"{r.status_code} {_error_of(r)[0]}" for r in responses}))
        return f"{probe.description}: expected {probe.status} {probe.expect_code or ''}".rstrip() + f", got {got}"
    if probe.burst > 1 and any(r.status_code not in (200, probe.status) for r in responses):
        return f"{probe.description}: unexpected statuses {sorted({r.status_code for r in responses})}"
    first = matching[0]
    if (first.status_code, _error_of(first)[0]) != (probe.status, probe.expect_code):
        return None  # an allowed alternative answer (e.g. the fallback's 200)
    if probe.expect_param is not None and _error_of(first)[1] != probe.expect_param:
        return f"{probe.description}: error.param is {_error_of(first)[1]!r}, expected {probe.expect_param!r}"
    if probe.expect_header and probe.expect_header not in {k.lower() for k in first.headers}:
        return f"{probe.description}: the {probe.status} answer lacks the {probe.expect_header} header"
    return None


def remote_drift(served: ServedModel, remote: Any) -> list[str]:
    """How a remote differs from what the manifest declares of it (engine, version, context length)."""
    if remote is None:
        return []
    problems = []
    declared = served.runtime.engine
    if declared is not None and declared.name.lower() != remote.engine:
        problems.append(f"runtime.engine.name declares {declared.name!r}, the remote reports {remote.engine!r}")
    if declared is not None and declared.version is not None and declared.version != remote.version:
        problems.append(f"runtime.engine.version declares {declared.version!r}, the remote reports {remote.version!r}")
    if remote.max_model_len is not None and remote.max_model_len < served.runtime.max_model_len:
        problems.append(
            f"runtime.max_model_len declares {served.runtime.max_model_len} tokens, the remote serves at most "
            f"{remote.max_model_len}: lower max_model_len or restart the remote with a longer context"
        )
    return problems


def _sse_text(body: str) -> str:
    text: list[str] = []
    for line in body.splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            chunk = json.loads(line[5:])
            text.extend(choice.get("text") or "" for choice in chunk.get("choices", []))
    return "".join(text)


class _Servers:
    """One in-process app per probe variant, started (lifespan) on first use and closed together."""

    def __init__(self, ctx: GateContext, create_app: AppFactory) -> None:
        self.ctx, self.create_app = ctx, create_app
        self.stack = AsyncExitStack()
        self.clients: dict[Variant, Any] = {}

    async def client(self, variant: Variant) -> Any:
        import httpx

        if variant not in self.clients:
            served = variant_manifest(self.ctx.candidate, variant)
            app = self.create_app(served, self.ctx.engines.factory(served))
            lifespan = getattr(getattr(app, "router", None), "lifespan_context", None)
            if lifespan is not None:
                await self.stack.enter_async_context(lifespan(app))
            transport = httpx.ASGITransport(app=app)
            client = await self.stack.enter_async_context(
                httpx.AsyncClient(transport=transport, base_url="http://servegate.gate", timeout=60.0)
            )
            if variant != "unready":
                await wait_ready(client)
            self.clients[variant] = client
        return self.clients[variant]


@register_gate(
    "contract",
    watches=GATE_WATCHES["contract"],
    beside_others=True,
    purpose=(
        "Every catalogued error is answered as declared, outputs satisfy output_schema and their output "
        "constraints, streaming and seeds agree, and a remote serves the declared context (measured where it "
        "reports none)."
    ),
)
class ContractGate(Gate):
    """Catalogue probes over HTTP, output validity, streamed == non-streamed, same seed -> same output (where
    draws differ), a remote's context (reported or measured); what could not be measured is named."""

    app_factory: AppFactory | None = None
    """Set in tests to drive a test double instead of servegate.server."""

    def run(self, ctx: GateContext) -> GateResult:
        """Run the HTTP probes when the server is available, the engine-level checks otherwise."""
        create_app = self.app_factory or default_app_factory()
        prompts = [item.prompt for data in ctx.suites() for item in data.items[:4]] or ["1+1="]
        drift = remote_drift(ctx.candidate, ctx.remote)
        if drift:
            seen = ContractMeasurements(remote=RemoteIdentity.model_validate(ctx.remote))
            return self.result("fail", f"{drift[0]} ({len(drift)} problem(s))", seen, [{"problem": p} for p in drift])
        context = remote_context(ctx)
        if create_app is None:
            return self._engine_only(ctx, prompts, context)
        server_log = logging.getLogger("servegate.server")
        level = server_log.level
        server_log.setLevel(logging.CRITICAL)  # the probes provoke warnings on purpose (e.g. the unready warm-up)
        try:  # every probe is the candidate's answers: --profile-gates shows them as its outputs, not "other"
            with ctx.split.phase("candidate outputs"):
                problems, measurements, seed = asyncio.run(self._http(ctx, create_app, prompts))
                structured_problems, structured = check_structured(ctx)
                constrained, constraints = check_constraints(ctx, prompts)
                tooled, tools = check_tools(ctx, prompts)
                template = check_template(ctx.candidate)
                penalties = check_penalties(ctx, prompts)
        finally:
            server_log.setLevel(level)
        if structured is not None:
            problems += structured_problems
            measurements = measurements.updated(structured_under_load=structured)
        if constraints is not None:
            measurements = measurements.updated(constraints_under_load=constraints)
        if tools is not None:
            measurements = measurements.updated(tools_under_load=tools)
        checks = [c for c in (context, seed, constrained, tooled, template, penalties) if c is not None]
        problems += [c.problem for c in checks if c.problem]
        measurements = with_checks(measurements, checks)
        if problems:
            return self.result("fail", f"{problems[0]} ({len(problems)} problem(s))", measurements,
                               [{"problem": p} for p in problems])  # fmt: skip
        summary = f"{measurements.probes} probes answered as declared; stream == non-stream"
        return self._verdict(summary, measurements, checks)

    def _verdict(self, summary: str, measurements: ContractMeasurements, checks: list[FieldCheck]) -> GateResult:
        """Pass when every field was reported or measured; warn, naming them, when some were not verified."""
        held = [_held(c) for c in checks if c.how != "not verified"]
        missing = [c for c in checks if c.how == "not verified"]
        reason = "; ".join([summary, *held])
        if missing:
            names = "; ".join(f"{c.field} ({c.detail})" for c in missing)
            return self.result("warn", f"{reason}; not verified: {names}", measurements)
        return self.result("pass", reason, measurements)

    async def _http(
        self, ctx: GateContext, create_app: AppFactory, prompts: list[str]
    ) -> tuple[list[str], ContractMeasurements, FieldCheck]:
        servers = _Servers(ctx, create_app)
        problems: list[str] = []
        probes = probes_for(ctx.candidate, prompts[0])
        covered = sorted({p.code for p in probes} | set(NOT_PROVOKABLE))
        ctx.progress.start("contract: probes", len(probes) + 3)
        async with servers.stack:
            for probe in probes:
                client = await servers.client(probe.variant)
                send = [
                    client.request(probe.method, probe.path, content=probe.body or None, headers=probe.headers)
                    for _ in range(probe.burst)
                ]
                problem = _check(probe, list(await asyncio.gather(*send)))
                if problem:
                    problems.append(f"{probe.code}: {problem}")
                ctx.progress.advance()
            main = await servers.client("main")
            problems += await self._outputs(ctx.candidate, main, prompts)
            # a response cache would answer the repeated seed itself: the draws go where it is off
            cached = ctx.candidate.postprocess.response_cache.enabled
            seeded = await servers.client("uncached" if cached else "main")
            seed = await check_seed(http_draw(ctx.candidate, seeded), seed_prompts(ctx.candidate, prompts))
            ctx.progress.advance(3)
        missing = sorted(set(CATALOGUE) - set(covered))
        if missing:
            problems.append(f"catalogue codes with no probe: {', '.join(missing)}")
        return (
            problems,
            ContractMeasurements(
                probes=len(probes),
                codes_provoked=sorted({p.code for p in probes}),
                not_provokable=NOT_PROVOKABLE,
                prompts_checked=len(prompts),
            ),
            seed,
        )

    async def _outputs(self, served: ServedModel, client: Any, prompts: list[str]) -> list[str]:
        problems = []
        schema = served.postprocess.output_schema
        headers = tenant_headers(served)
        for prompt in prompts:
            body = {
                "model": served.name,
                "prompt": prompt,
                "max_tokens": 16,
                "temperature": 0.0,
                **tenant_fields(served),
            }
            plain = await client.post(COMPLETIONS, json=body, headers=headers)
            streamed = await client.post(COMPLETIONS, json={**body, "stream": True}, headers=headers)
            if plain.status_code != 200:
                code, _ = _error_of(plain)
                if not (schema is not None and code == "invalid_output"):
                    problems.append(f"a valid request got {plain.status_code} {code}")
                continue
            text = plain.json()["choices"][0].get("text", "")
            if _sse_text(streamed.text) != text:
                problems.append(f"streamed text differs from non-streamed text for prompt of {len(prompt)} chars")
            if schema is not None and served.failure_policy.on_invalid_output == "error":
                try:
                    jsonschema.validate(json.loads(text), schema)
                except (ValueError, jsonschema.ValidationError):
                    problems.append("a 200 answer is not valid under output_schema (on_invalid_output: error)")
        return problems

    def _engine_only(self, ctx: GateContext, prompts: list[str], context: FieldCheck | None) -> GateResult:
        """Same seed -> same output, streamed == generated, on the engine; the HTTP contract unchecked."""
        engine = ctx.engines.fresh(variant_manifest(ctx.candidate, "uncached"))
        problems = []
        seed = asyncio.run(check_seed(engine_draw(engine), seed_prompts(ctx.candidate, prompts)))
        greedy = SamplingParams(max_tokens=16)
        whole = engine.generate([GenerationRequest(id="plain", prompt=prompts[0], params=greedy)])[0]

        async def stream() -> str:
            parts = []
            async for event in engine.submit(GenerationRequest(id="stream", prompt=prompts[0], params=greedy)):
                parts.append(getattr(event, "text", "") if not isinstance(event, FinishEvent) else "")
            return "".join(parts)

        if isinstance(whole, FinishEvent) and asyncio.run(stream()) != whole.text:
            problems.append("streamed text differs from generated text")
        checks = [c for c in (context, seed) if c is not None]
        problems += [c.problem for c in checks if c.problem]
        measurements = with_checks(ContractMeasurements(http_checked=False, prompts_checked=1), checks)
        if problems:
            return self.result("fail", problems[0], measurements)
        held = "; ".join(_held(c) for c in checks if c.how != "not verified")
        missing = "; ".join(f"{c.field} ({c.detail})" for c in checks if c.how == "not verified")
        return self.result(
            "warn",
            "engine-level contract holds; the HTTP contract was not checked (servegate.server unavailable)"
            + (f"; {held}" if held else "")
            + (f"; not verified: {missing}" if missing else ""),
            measurements,
        )


def _held(check: FieldCheck) -> str:
    return f"{check.field} {check.how}: {check.detail}"


def with_checks(measurements: ContractMeasurements, checks: list[FieldCheck]) -> ContractMeasurements:
    """The measurements with how each field was checked, and the fields not verified, filled in."""
    return measurements.updated(
        checked={c.field: f"{c.how}: {c.detail}" for c in checks if c.how != "not verified"} or None,
        not_verified=[f"{c.field}: {c.detail}" for c in checks if c.how == "not verified"] or None,
        field_requests=sum(c.requests for c in checks),
    )


def http_draw(served: ServedModel, client: Any) -> Draw:
    """A seed draw as a client sends it: POST /v1/completions, sampled, naming the tenant as the manifest says."""
    headers = tenant_headers(served)

    async def draw(prompt: str, seed: int) -> tuple[str | None, str]:
        body = {**seed_body(served.name, prompt, seed), **tenant_fields(served)}
        response = await client.post(COMPLETIONS, json=body, headers=headers)
        if response.status_code != 200:
            return None, f"HTTP {response.status_code} {_error_of(response)[0]}"
        return str(response.json()["choices"][0].get("text") or ""), "HTTP 200"

    return draw


def engine_draw(engine: Any) -> Draw:
    """A seed draw on the engine itself (no HTTP server to send it through)."""

    async def draw(prompt: str, seed: int) -> tuple[str | None, str]:
        params = SamplingParams(max_tokens=SEED_TOKENS, temperature=SEED_TEMPERATURE, seed=seed)
        [result] = await asyncio.to_thread(engine.generate, [GenerationRequest(f"seed-{seed}", prompt, params=params)])
        if not isinstance(result, FinishEvent):
            return None, str(getattr(getattr(result, "error", None), "code", "error"))
        return result.text, "finished"

    return draw


def remote_context(ctx: GateContext) -> FieldCheck | None:
    """The context a remote candidate serves: as its /v1/models reports it, else measured with one prompt at the
    declared context sent to the remote directly; None for servegate's own runtime (it enforces the limit)."""
    served = ctx.candidate
    if not served.runtime.remote:
        return None
    import httpx

    declared = served.runtime.max_model_len
    engine = cast("EndpointEngine", ctx.engines.get(served))  # a remote manifest's engine talks to its URL
    engine.start_sync()
    identity = ctx.remote or engine.identity
    if identity is not None and identity.max_model_len is not None:
        return context_reported(declared, identity.max_model_len)
    if served.preprocess.task != "generate":
        why = "the remote reports none, and an embedding model's context is not probed"
        return FieldCheck(CONTEXT_FIELD, "not verified", why)
    tokenizer = engine.tokenizer
    if tokenizer is None:
        from servegate.runtime.model.weights import load_tokenizer

        tokenizer = load_tokenizer(served)

    async def probe() -> FieldCheck:
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
            return await measure_context(client, engine.base_url, engine.model, served, tokenizer)

    return asyncio.run(probe())
