"""The `contract` gate: the served API answers exactly as the manifest's contract and the error catalogue say.

Runs the HTTP app in process (`servegate.server.create_app`, driven through httpx's ASGI transport):
every catalogued error is provoked and must come back with its status, code and param; no probe may
get a 500; valid requests give outputs valid under `output_schema`; streamed text equals non-streamed
text; the same seed gives the same output. Without the server, the engine-level part runs and the
gate warns that the HTTP contract was not checked.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from typing import Any

import jsonschema

from servegate.contracts.diff import GATE_WATCHES
from servegate.contracts.errors import CATALOGUE
from servegate.contracts.manifest import ServedModel
from servegate.gates.base import Gate, GateContext
from servegate.gates.contract_probes import (
    COMPLETIONS,
    NOT_PROVOKABLE,
    Probe,
    Variant,
    probes_for,
    tenant_fields,
    tenant_headers,
    variant_manifest,
)
from servegate.gates.http_target import wait_ready
from servegate.gates.registry import register_gate
from servegate.gates.result import OPTIONAL, GateResult, Measurements
from servegate.gates.structured_load import StructuredUnderLoad, check_structured
from servegate.runtime.engine.interface import FinishEvent, GenerationRequest, SamplingParams

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
    text = []
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


@dataclass(frozen=True)
class ContractMeasurements(Measurements):
    """What the contract gate probed: over HTTP (the probes and codes), or on the engine alone."""

    remote: dict[str, Any] | None = field(default=None, metadata=OPTIONAL)
    """The identity a remote reported, when it differs from the manifest (the drift failure)."""
    http_checked: bool | None = field(default=None, metadata=OPTIONAL)
    """False when servegate.server was unavailable and only the engine-level checks ran."""
    probes: int | None = field(default=None, metadata=OPTIONAL)
    """HTTP probes sent, one per catalogued behaviour and variant (probes)."""
    codes_provoked: list[str] | None = field(default=None, metadata=OPTIONAL)
    """Catalogue error codes the probes provoked."""
    not_provokable: list[str] | None = field(default=None, metadata=OPTIONAL)
    """Catalogue error codes no request can provoke from outside (e.g. an internal error)."""
    prompts_checked: int | None = field(default=None, metadata=OPTIONAL)
    """Prompts whose outputs were checked for validity, streaming and seeding (prompts)."""
    structured_under_load: StructuredUnderLoad | None = field(default=None, metadata=OPTIONAL)
    """Schema validity and answer size at concurrency 1 and under load (when output_schema or
    max_output_bytes is declared)."""


@register_gate(
    "contract",
    watches=GATE_WATCHES["contract"],
    purpose="Every catalogued error is answered as declared, outputs satisfy output_schema, streaming and seeds agree.",
)
class ContractGate(Gate):
    """Catalogue probes over HTTP, output validity, streamed == non-streamed, same seed -> same output."""

    app_factory: AppFactory | None = None
    """Set in tests to drive a test double instead of servegate.server."""

    def run(self, ctx: GateContext) -> GateResult:
        """Run the HTTP probes when the server is available, the engine-level checks otherwise."""
        create_app = self.app_factory or default_app_factory()
        prompts = [item.prompt for data in ctx.suites() for item in data.items[:4]] or ["1+1="]
        drift = remote_drift(ctx.candidate, ctx.remote)
        if drift:
            seen = ContractMeasurements(remote=ctx.remote.to_dict())
            return self.result("fail", f"{drift[0]} ({len(drift)} problem(s))", seen, [{"problem": p} for p in drift])
        if create_app is None:
            return self._engine_only(ctx, prompts)
        server_log = logging.getLogger("servegate.server")
        level = server_log.level
        server_log.setLevel(logging.CRITICAL)  # the probes provoke warnings on purpose (e.g. the unready warm-up)
        try:
            problems, measurements = asyncio.run(self._http(ctx, create_app, prompts))
            structured_problems, structured = check_structured(ctx)
        finally:
            server_log.setLevel(level)
        if structured is not None:
            problems += structured_problems
            measurements = replace(measurements, structured_under_load=structured)
        if problems:
            return self.result("fail", f"{problems[0]} ({len(problems)} problem(s))", measurements,
                               [{"problem": p} for p in problems])  # fmt: skip
        return self.result(
            "pass",
            f"{measurements.probes} probes answered as declared; stream == non-stream; same seed, same output",
            measurements,
        )

    async def _http(
        self, ctx: GateContext, create_app: AppFactory, prompts: list[str]
    ) -> tuple[list[str], ContractMeasurements]:
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
            ctx.progress.advance(3)
        missing = sorted(set(CATALOGUE) - set(covered))
        if missing:
            problems.append(f"catalogue codes with no probe: {', '.join(missing)}")
        return problems, ContractMeasurements(
            probes=len(probes),
            codes_provoked=sorted({p.code for p in probes}),
            not_provokable=NOT_PROVOKABLE,
            prompts_checked=len(prompts),
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
        seeded = {"model": served.name, "prompt": prompts[0], "max_tokens": 16, "temperature": 1.0, "seed": 1234}
        seeded.update(tenant_fields(served))
        first = await client.post(COMPLETIONS, json=seeded, headers=headers)
        second = await client.post(COMPLETIONS, json=seeded, headers=headers)
        if first.status_code == 200 and first.json()["choices"][0]["text"] != second.json()["choices"][0]["text"]:
            problems.append("the same seed gave different outputs")
        return problems

    def _engine_only(self, ctx: GateContext, prompts: list[str]) -> GateResult:
        """Same seed -> same output, streamed == generated, on the engine; the HTTP contract unchecked."""
        engine = ctx.engines.fresh(ctx.candidate)
        problems = []
        seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=1234)
        a, b = engine.generate([GenerationRequest(id=f"seed-{i}", prompt=prompts[0], params=seeded) for i in range(2)])
        if isinstance(a, FinishEvent) and isinstance(b, FinishEvent) and a.token_ids != b.token_ids:
            problems.append("the same seed gave different outputs")
        greedy = SamplingParams(max_tokens=16)
        whole = engine.generate([GenerationRequest(id="plain", prompt=prompts[0], params=greedy)])[0]

        async def stream() -> str:
            parts = []
            async for event in engine.submit(GenerationRequest(id="stream", prompt=prompts[0], params=greedy)):
                parts.append(getattr(event, "text", "") if not isinstance(event, FinishEvent) else "")
            return "".join(parts)

        if isinstance(whole, FinishEvent) and asyncio.run(stream()) != whole.text:
            problems.append("streamed text differs from generated text")
        measurements = ContractMeasurements(http_checked=False, prompts_checked=1)
        if problems:
            return self.result("fail", problems[0], measurements)
        return self.result(
            "warn",
            "engine-level contract holds; the HTTP contract was not checked (servegate.server unavailable)",
            measurements,
        )
