"""`gate verify`: is what runs at a URL what the manifest declares? A few reads and requests, no load.

Each check is named by the manifest field it compares (e.g. `runtime.kv_cache.block_size`) and ends
pass, fail (drift) or skipped (the deployment does not expose it, or the manifest does not declare it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import httpx

from servegate.contracts.constraint_fields import OutputConstraint
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.check_report import ManifestSide
from servegate.deploy import deployment_facts as facts
from servegate.deploy.llamacpp_verify import json_of, llamacpp_facts
from servegate.gates.probes.constraint_load import MAX_TOKENS, PROBE_SCHEMA
from servegate.gates.probes.contract_probes import probes_for, tenant_fields, tenant_headers
from servegate.gates.probes.http_target import Answer, read_plain
from servegate.gates.probes.tool_load import MAX_TOKENS as TOOL_TOKENS
from servegate.gates.probes.tool_load import PROBE_CHOICES, PROBE_TOOL, call_problem
from servegate.gates.result import GateReport, GateResult, Measurements, Verdict
from servegate.runtime.postprocess import constraint_problem

_PROBE_FIELDS = {"unknown_parameter": "preprocess.unknown_fields", "input_too_long": "preprocess.truncation"}


@dataclass(frozen=True)
class FieldDrift(Measurements):
    """One manifest field as declared and as the deployment reports it."""

    declared: Any
    """The manifest's value (in the field's own unit)."""
    observed: Any
    """What the deployment exposes for it (same unit); None when it does not expose it."""


@dataclass
class VerifyReport:
    """The outcome of one `gate verify`: every check, and whether the deployment drifted."""

    url: str
    manifest: dict[str, Any]
    checks: list[GateResult]
    duration_s: float = 0.0
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def drift(self) -> list[str]:
        """The manifest fields whose check failed."""
        return [c.name for c in self.checks if c.verdict == "fail"]

    @property
    def verdict(self) -> str:
        """`fail` when anything drifted, otherwise `pass`."""
        return "fail" if self.drift else "pass"

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable report written by `--json`."""
        return {
            "verdict": self.verdict,
            "url": self.url,
            "manifest": self.manifest,
            "created_at": self.created_at,
            "duration_s": round(self.duration_s, 3),
            "drift": self.drift,
            "counts": {v: sum(c.verdict == v for c in self.checks) for v in ("pass", "fail", "skipped")},
            "checks": [c.to_dict() for c in self.checks],
        }

    def as_gate_report(self) -> GateReport:
        """The same checks as a GateReport, for the JUnit writer `gate check` uses."""
        return GateReport(
            baseline=ManifestSide(name="deployment", url=self.url),
            candidate=ManifestSide.model_validate(self.manifest),
            gates=self.checks,
            duration_s=self.duration_s,
            created_at=self.created_at,
        )


def _result(path: str, ok: bool | None, reason: str, source: str, declared: Any, observed: Any) -> GateResult:
    verdict: Verdict = "skipped" if ok is None else ("pass" if ok else "fail")
    measurements = FieldDrift(declared=declared, observed=observed)
    return GateResult(path, verdict, reason, measurements=measurements, triggered_by=[source])


def _compare(path: str, declared: Any, observed: Any, source: str, what: str = "") -> GateResult:
    if observed is None:
        return _result(path, None, f"{source} does not expose {what or path}", source, declared, None)
    if declared is None:
        return _result(path, None, f"reported {observed!r}; the manifest declares none", source, None, observed)
    ok = declared == observed
    reason = f"{observed!r} as declared" if ok else f"manifest {declared!r}, served {observed!r}"
    return _result(path, ok, reason, source, declared, observed)


class _Remote:
    """GET/POST against the deployment; a transport error on the first call means it cannot be reached."""

    def __init__(self, url: str, timeout_s: float, client: httpx.Client | None = None) -> None:
        base = url.rstrip("/")
        self.base = base[: -len("/v1")] if base.endswith("/v1") else base
        self.client = client or httpx.Client(timeout=timeout_s)

    def get(self, path: str) -> httpx.Response | None:
        """The answer, or None when the request itself failed."""
        try:
            return self.client.get(self.base + path)
        except httpx.HTTPError:
            return None

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response | None:
        """The answer, or None when the request itself failed."""
        try:
            return self.client.post(self.base + path, content=body, headers=headers)
        except httpx.HTTPError:
            return None


def _model_checks(served: ServedModel, models: httpx.Response) -> list[GateResult]:
    expected = served.runtime.endpoint_model or served.name
    data = (json_of(models) or {}).get("data") or []
    ids = [str(entry.get("id")) for entry in data if isinstance(entry, dict)]
    out = [
        _result(
            "name",
            expected in ids,
            f"serves {expected!r}" if expected in ids else f"serves {ids or 'no model'}, not {expected!r}",
            "GET /v1/models",
            expected,
            ids,
        )
    ]
    entry = next((e for e in data if isinstance(e, dict) and str(e.get("id")) == expected), {})
    out.append(
        _compare("runtime.max_model_len", served.runtime.max_model_len, entry.get("max_model_len"), "GET /v1/models")
    )
    return out


def _engine_checks(
    remote: _Remote, models: httpx.Response, declared: tuple[str | None, str | None]
) -> list[GateResult]:
    version = json_of(remote.get("/version"))
    info = None if version else json_of(remote.get("/info"))
    name, number = facts.engine_from_answers(version, info, models.headers.get("server"))
    source = "GET /version" if version else ("GET /info" if info else "server header")
    return [
        _compare("runtime.engine.name", declared[0], name, source, "the engine's name"),
        _compare("runtime.engine.version", declared[1], number, source, "the engine's version"),
    ]


def _gateway_check(served: ServedModel, remote: _Remote) -> GateResult:
    """A servegate gateway says which manifest it serves in /ready: the fingerprint must be this one's."""
    ready = remote.get("/ready")
    data = None
    if ready is not None:
        try:
            data = ready.json()
        except ValueError:
            data = None
    observed = data.get("fingerprint") if isinstance(data, dict) else None
    if observed is None:
        return _result("fingerprint", None, "no servegate gateway answers /ready here", "GET /ready", None, None)
    ok = observed == served.fingerprint
    reason = "the gateway serves this manifest" if ok else f"the gateway serves fingerprint {str(observed)[:12]}"
    return _result("fingerprint", ok, reason, "GET /ready", served.fingerprint, observed)


def _name_the_fields(checks: list[GateResult]) -> list[GateResult]:
    """A fingerprint that differs says which compared fields differ too (a fingerprint alone names none)."""
    fingerprint = next((c for c in checks if c.name == "fingerprint" and c.verdict == "fail"), None)
    if fingerprint is None:
        return checks
    drifted = [f"{c.name}: {c.reason}" for c in checks if c.verdict == "fail" and c.name != "fingerprint"]
    which = "; ".join(drifted) if drifted else "no field this check can read differs (the change is elsewhere)"
    declared = str(getattr(fingerprint.measurements, "declared", ""))[:12]
    fingerprint.reason = f"{fingerprint.reason}, not this manifest's {declared}: {which}"
    return checks


def _cache_checks(served: ServedModel, remote: _Remote) -> list[GateResult]:
    kv = served.runtime.kv_cache
    metrics = remote.get("/metrics")
    labels = facts.cache_config_labels(metrics.text) if metrics is not None and metrics.status_code == 200 else None
    source = "GET /metrics vllm:cache_config_info"
    paths = ("block_size", "dtype", "prefix_caching", "memory_budget")
    if kv is None:
        return [
            _result(f"runtime.kv_cache.{p}", None, "the manifest declares no kv_cache", source, None, None)
            for p in paths
        ]
    if labels is None:
        return [
            _result(f"runtime.kv_cache.{p}", None, f"no {facts.CACHE_INFO} in /metrics", source, None, None)
            for p in paths
        ]
    block = labels.get("block_size")
    out = [
        _compare(
            "runtime.kv_cache.block_size", kv.block_size, int(block) if block and block.isdigit() else None, source
        )
    ]
    dtype = labels.get("cache_dtype")
    ok = None if dtype is None else facts.same_cache_dtype(kv.dtype, dtype)
    out.append(
        _result(
            "runtime.kv_cache.dtype", ok, f"cache_dtype {dtype!r} for declared {kv.dtype!r}", source, kv.dtype, dtype
        )
    )
    prefix = facts.truthy(labels.get("enable_prefix_caching", ""))
    out.append(_compare("runtime.kv_cache.prefix_caching", kv.prefix_caching, prefix, source))
    out.append(_budget_check(served, labels, source))
    return out


def _budget_check(served: ServedModel, labels: dict[str, str], source: str) -> GateResult:
    kv = served.runtime.kv_cache
    assert kv is not None
    budget = labels.get("kv_cache_memory_bytes", "")
    if budget.isdigit() and int(budget) != int(kv.memory_budget):
        return _result(
            "runtime.kv_cache.memory_budget",
            False,
            f"declared {int(kv.memory_budget)} bytes, the engine has {budget}",
            source,
            int(kv.memory_budget),
            int(budget),
        )
    blocks, expected = labels.get("num_gpu_blocks", ""), facts.expected_kv_blocks(served)
    if not blocks.isdigit():
        return _result("runtime.kv_cache.memory_budget", None, "num_gpu_blocks not exposed", source, expected, None)
    if expected is None:
        return _result(
            "runtime.kv_cache.memory_budget",
            None,
            f"{blocks} blocks; the model's shape is not at hand to compare",
            source,
            None,
            int(blocks),
        )
    ok = int(blocks) == expected
    reason = (
        f"{blocks} KV blocks, as the budget buys"
        if ok
        else f"the budget buys {expected} KV blocks, the engine has {blocks}"
    )
    return _result("runtime.kv_cache.memory_budget", ok, reason, source, expected, int(blocks))


def _warmup_checks(served: ServedModel, remote: _Remote) -> list[GateResult]:
    out = []
    model = served.runtime.endpoint_model or served.name
    headers = {"content-type": "application/json", **tenant_headers(served)}
    for i, warm in enumerate(served.runtime.warmup):
        body = {
            "model": model,
            "prompt": warm.prompt,
            "max_tokens": warm.max_tokens,
            "temperature": 0,
            **tenant_fields(served),
        }
        answer = remote.post("/v1/completions", json.dumps(body).encode("utf-8"), headers)
        path, source = f"runtime.warmup[{i}].expect", "POST /v1/completions"
        if answer is None or answer.status_code != 200:
            status = "no answer" if answer is None else f"HTTP {answer.status_code}"
            out.append(_result(path, False, f"{warm.prompt!r} got {status}", source, warm.expect, status))
            continue
        text = ((json_of(answer) or {}).get("choices") or [{}])[0].get("text")
        if warm.expect is None:
            out.append(_result(path, True, f"{warm.prompt!r} generates (no output declared)", source, None, text))
        else:
            out.append(_compare(path, warm.expect, text, source))
    return out


def _error_checks(served: ServedModel, remote: _Remote) -> list[GateResult]:
    out = []
    for probe in probes_for(served):
        path = _PROBE_FIELDS.get(probe.code)
        if path is None or probe.variant != "main":
            continue
        answer = remote.post(probe.path, probe.body, probe.headers)
        observed = None if answer is None else answer.status_code
        allowed = {probe.status, *(status for status, _ in probe.also)}
        ok = observed in allowed
        reason = f"{probe.description}: HTTP {observed}" + ("" if ok else f", the manifest declares {probe.status}")
        out.append(_result(path, ok, reason, f"POST {probe.path}", probe.status, observed))
    return out


def _constraint_check(served: ServedModel, remote: _Remote, prompt: str) -> GateResult | None:
    """One greedy json_schema constraint: an answer it ended must satisfy it (None: no constraint to send)."""
    structured = served.postprocess.structured_output
    if structured is None or not structured.request_constraints or "json_schema" not in structured.kinds:
        return None
    tokens = min(MAX_TOKENS, served.postprocess.max_output_tokens)
    body = {"model": served.runtime.endpoint_model or served.name, "prompt": prompt, "max_tokens": tokens,
            "temperature": 0, "structured_outputs": {"json": PROBE_SCHEMA}, **tenant_fields(served)}  # fmt: skip
    constraint = OutputConstraint("json_schema", json.dumps(PROBE_SCHEMA), "structured_outputs.json")
    return _output_check(
        served,
        remote,
        ("postprocess.structured_output", "/v1/completions", body),
        ("a json_schema constraint", "the answer", "a json_schema answer satisfies its schema"),
        lambda answer: constraint_problem(constraint, answer.text),
        lambda answer: answer.text,
    )


def _tool_check(served: ServedModel, remote: _Remote, prompt: str) -> GateResult | None:
    """One named tool call: its arguments must parse and satisfy the function's schema (None: not served)."""
    tools = served.postprocess.tools
    if tools is None or "named" not in tools.tool_choice:
        return None
    tokens = min(TOOL_TOKENS, served.postprocess.max_output_tokens)
    body = {"model": served.runtime.endpoint_model or served.name, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": tokens, "temperature": 0, "tools": [PROBE_TOOL], "tool_choice": PROBE_CHOICES["named"],
            **tenant_fields(served)}  # fmt: skip
    return _output_check(
        served,
        remote,
        ("postprocess.tools", "/v1/chat/completions", body),
        ("a named tool call", "the call", "a named call parses and satisfies its schema"),
        lambda answer: call_problem("named", answer),
        lambda answer: list(answer.tool_calls),
    )


def _output_check(
    served: ServedModel,
    remote: _Remote,
    request: tuple[str, str, dict[str, Any]],
    words: tuple[str, str, str],
    problem_of: Callable[[Answer], str | None],
    observed_of: Callable[[Answer], Any],
) -> GateResult:
    """One greedy generation judged: `request` (field, endpoint path, body); `words` (what was sent, what
    should end, what a sound answer shows). A refusal is drift, an answer cut at max_tokens is skipped."""
    field_path, endpoint, body = request
    sent, ending, sound = words
    tokens = body["max_tokens"]
    answer = _generated(remote, endpoint, body, tokens, served)
    source = f"POST {endpoint}"
    if isinstance(answer, str):
        return _result(field_path, False, f"{sent} got {answer}", source, "served", answer)
    if not answer.finish_reasons or answer.finish_reasons[-1] != "stop":
        return _result(field_path, None, f"{ending} did not end within {tokens} tokens", source, "served", answer.text)
    problem = problem_of(answer)
    return _result(
        field_path, problem is None, sound if problem is None else problem, source, "served", observed_of(answer)
    )


def _generated(remote: _Remote, path: str, body: dict[str, Any], tokens: int, served: ServedModel) -> Answer | str:
    """The deployment's answer to one generation request, or what it answered instead ("HTTP 400 ...")."""
    headers = {"content-type": "application/json", **tenant_headers(served)}
    answer = remote.post(path, json.dumps(body).encode("utf-8"), headers)
    if answer is None or answer.status_code != 200:
        return "no answer" if answer is None else f"HTTP {answer.status_code}: {answer.text[:160]}"
    return read_plain(json_of(answer) or {}, tokens)


def verify_deployment(
    served: ServedModel,
    url: str,
    *,
    engine: str | None = None,
    engine_version: str | None = None,
    timeout_s: float = 30.0,
    client: httpx.Client | None = None,
) -> VerifyReport:
    """Check the deployment at `url` against the manifest; raises ServegateError when it cannot be reached."""
    if not url.startswith(("http://", "https://")):
        raise ServegateError(f"--url must start with http:// or https:// (got {url!r})")
    start = time.perf_counter()
    remote = _Remote(url, timeout_s, client)
    models = remote.get("/v1/models")
    if models is None:
        raise ServegateError(f"cannot reach {remote.base}/v1/models: check --url and that the deployment is up")
    declared = facts.declared_engine(served)
    declared = (engine or declared[0], engine_version or declared[1])
    checks = [_gateway_check(served, remote), *_model_checks(served, models), *_engine_checks(remote, models, declared)]
    checks += _cache_checks(served, remote)
    checks += [_result(path, *rest) for path, *rest in llamacpp_facts(served, remote.get)]  # a llama-server only
    if served.preprocess.task == "generate":  # the warm-up and error probes are completions
        checks += _warmup_checks(served, remote) + _error_checks(served, remote)
        prompt = served.runtime.warmup[0].prompt if served.runtime.warmup else "1+1="
        checks += [c for c in (_constraint_check(served, remote, prompt), _tool_check(served, remote, prompt)) if c]
    checks = _name_the_fields(checks)
    identity = {"name": served.name, "version": served.version, "fingerprint": served.fingerprint}
    return VerifyReport(url=remote.base, manifest=identity, checks=checks, duration_s=time.perf_counter() - start)
