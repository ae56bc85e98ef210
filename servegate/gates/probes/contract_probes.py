"""HTTP probes that provoke every error of the catalogue, with the answer a manifest's contract declares.

Each probe names the server variant it needs: `main` (the manifest as declared), `overload` (a queue of
one), `deadline` (a 1 ms deadline) or `unready` (a warm-up that can never match, so the model never
becomes ready); the seed draws use `uncached` (the response cache off, so a repeat reaches the model).
Codes a client cannot provoke are listed in NOT_PROVOKABLE with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from servegate.contracts.manifest import ServedModel

Variant = Literal["main", "overload", "deadline", "unready", "uncached"]
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
UNKNOWN_FIELD = "servegate_probe_unknown_field"
HARMLESS_FIELD = "metadata"
"""A field on the harmless list (contracts/field_policy.py): dropped under `ignore`, refused under `reject`."""
PROBE_TENANT = "servegate-contract-probe"

NOT_PROVOKABLE: dict[str, str] = {
    "internal": "a server fault; no client request may produce it (every probe also checks that none gives a 500)",
    "invalid_output": "depends on what the model writes; checked on the suite outputs when output_schema is declared",
}


@dataclass(frozen=True)
class Probe:
    """One request (or a burst of identical ones) and the answer the contract requires."""

    code: str
    """The catalogue code this probe provokes."""
    description: str
    status: int
    """Expected HTTP status (200 when the manifest's policy answers instead of refusing)."""
    expect_code: str | None
    """Expected error.code (None for a 200)."""
    body: bytes
    variant: Variant = "main"
    method: str = "POST"
    path: str = COMPLETIONS
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})
    """Request headers (probes_for adds the tenant header where the manifest identifies tenants by header)."""
    expect_param: str | None = None
    burst: int = 1
    """Requests sent at once; the expected answer must appear at least once and nothing else but 200."""
    expect_header: str | None = None
    """A header the error response must carry (e.g. Retry-After)."""
    also: tuple[tuple[int, str | None], ...] = ()
    """Other (status, error code) answers the contract allows."""
    tenant: bool = True
    """Whether the request names its tenant the way the manifest says (False: the missing-tenant probe)."""


def _json(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode("utf-8")


def probes_for(served: ServedModel, prompt: str = "1+1=") -> list[Probe]:
    """The probes for a manifest, with each expected answer derived from its declared policies."""
    pre, fail = served.preprocess, served.failure_policy
    fallback_on = set(fail.fallback.triggers) if fail.fallback is not None else set()
    model = served.name
    ok: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": 4, **tenant_fields(served)}
    json_headers = {"content-type": "application/json", **tenant_headers(served)}
    long_prompt = " ".join(["1"] * (pre.max_input_tokens * 2 + 8))
    probes = [
        Probe("invalid_request", "malformed JSON body", 400, "invalid_request", b'{"model": "m", "prompt": "1+1=", '),
        Probe(
            "invalid_request",
            "max_tokens of the wrong type",
            400,
            "invalid_request",
            _json({**ok, "max_tokens": "many"}),
            expect_param="max_tokens",
        ),
        Probe(
            "invalid_request",
            "max_tokens out of range",
            400,
            "invalid_request",
            _json({**ok, "max_tokens": -1}),
            expect_param="max_tokens",
        ),
        Probe("invalid_request", "prompt missing", 400, "invalid_request", _json({"model": model, "max_tokens": 4})),
        Probe(
            "unknown_parameter",
            "unknown field (refused under every unknown_fields policy: dropping it is not known to be safe)",
            400,
            "unknown_parameter",
            _json({**ok, UNKNOWN_FIELD: 1}),
            expect_param=UNKNOWN_FIELD,
        ),
        Probe(
            "unknown_parameter",
            f"a field known to be harmless, metadata ({pre.unknown_fields})",
            400 if pre.unknown_fields == "reject" else 200,
            "unknown_parameter" if pre.unknown_fields == "reject" else None,
            _json({**ok, HARMLESS_FIELD: {"k": "v"}}),
            expect_param=HARMLESS_FIELD if pre.unknown_fields == "reject" else None,
        ),
        Probe(
            "unsupported_parameter",
            "best_of: 3 (answer-changing, not implemented: refused under every unknown_fields policy)",
            400,
            "unsupported_parameter",
            _json({**ok, "best_of": 3}),
            expect_param="best_of",
        ),
        Probe(
            "input_too_long",
            f"prompt over max_input_tokens (truncation {pre.truncation})",
            400 if pre.truncation == "reject" else 200,
            "input_too_long" if pre.truncation == "reject" else None,
            _json({**ok, "prompt": long_prompt, "max_tokens": 2}),
        ),
        Probe(
            "payload_too_large",
            "body larger than max_payload_bytes",
            413,
            "payload_too_large",
            _json({**ok, "prompt": "x" * (pre.max_payload_bytes + 16)}),
        ),
        Probe(
            "unsupported_media",
            "text/plain body",
            415,
            "unsupported_media",
            b"1+1=",
            headers={"content-type": "text/plain"},
        ),
        Probe(
            "not_found",
            "unknown asynchronous request id",
            404,
            "not_found",
            b"",
            method="GET",
            path="/v1/requests/servegate-no-such-request",
            headers={},
        ),
        Probe(
            "overloaded",
            f"burst into a queue of 1 (overload {fail.overload}, status {fail.overload_status})",
            200 if "overload" in fallback_on else fail.overload_status,
            None if "overload" in fallback_on else "overloaded",
            _json({**ok, "max_tokens": 16}),
            variant="overload",
            burst=24,
            expect_header=None if "overload" in fallback_on else "retry-after",
        ),
        Probe(
            "deadline_exceeded",
            "a 1 ms deadline" + (" (fallback on timeout)" if "timeout" in fallback_on else ""),
            504,
            "deadline_exceeded",
            _json({**ok, "max_tokens": 16}),
            variant="deadline",
            # the fallback may answer in time, or its restarted deadline may pass too
            also=((200, None),) if "timeout" in fallback_on else (),
        ),
        Probe(
            "model_unavailable",
            "a warm-up that never matches keeps the model unready",
            503,
            "model_unavailable",
            _json(ok),
            variant="unready",
        ),
    ]
    probes.append(_constraint_probe(served, ok))
    if pre.tenant_from != "none":
        where = "X-Tenant header" if pre.tenant_from == "header" else "user field"
        bare = {k: v for k, v in ok.items() if k != "user"}
        probes.append(
            Probe(
                "invalid_request",
                f"no tenant although tenant_from is {pre.tenant_from} ({where})",
                400,
                "invalid_request",
                _json(bare),
                tenant=False,
            )
        )
    return [
        p if not p.tenant or "json" not in p.headers.get("content-type", "") else replace(p, headers=json_headers)
        for p in probes
    ]


def _constraint_probe(served: ServedModel, ok: dict[str, Any]) -> Probe:
    """An output constraint the manifest cannot take, refused in front of any backend: a schema that is not a
    JSON Schema, else one larger than structured_output.max_spec_bytes (invalid_constraint); any constraint
    where no structured output is declared, or a kind not served (unsupported_parameter)."""
    structured = served.postprocess.structured_output
    if structured is None or not structured.request_constraints:
        return Probe(
            "invalid_constraint",
            "an output constraint where the manifest takes none from requests",
            400,
            "unsupported_parameter",
            _json({**ok, "guided_regex": "[0-9]+"}),
            expect_param="guided_regex",
        )
    value: object  # the constraint's invalid value: a schema, a pattern, a grammar or a list of choices
    if "json_schema" in structured.kinds:
        name, value, what = "guided_json", {"type": "nonsense"}, "a schema that is not a JSON Schema"
    else:
        big = "x" * (structured.max_spec_bytes + 16)
        sized = {"regex": ("guided_regex", big), "choice": ("guided_choice", [big]),
                 "grammar": ("guided_grammar", f'start: "{big}"')}  # fmt: skip
        name, value = next((sized[k] for k in structured.kinds if k in sized), ("", ""))
        what = f"a constraint larger than max_spec_bytes {structured.max_spec_bytes}"
    body = _json({**ok, name: value}) if name else b""
    if not name or len(body) > served.preprocess.max_payload_bytes:
        # json_object alone has a fixed small schema, and a body past the payload limit is refused for its size:
        # json_schema, which this manifest does not serve, is refused instead
        return Probe(
            "invalid_constraint",
            "a kind the manifest does not serve (json_schema)",
            400,
            "unsupported_parameter",
            _json({**ok, "guided_json": {"type": "object"}}),
            expect_param="guided_json",
        )
    return Probe("invalid_constraint", what, 400, "invalid_constraint", body, expect_param=name)


def tenant_headers(served: ServedModel, tenant: str = PROBE_TENANT) -> dict[str, str]:
    """Headers that name the tenant, when the manifest takes it from the X-Tenant header."""
    return {"X-Tenant": tenant} if served.preprocess.tenant_from == "header" else {}


def tenant_fields(served: ServedModel, tenant: str = PROBE_TENANT) -> dict[str, str]:
    """Body fields that name the tenant, when the manifest takes it from the `user` field."""
    return {"user": tenant} if served.preprocess.tenant_from == "user" else {}


def variant_manifest(served: ServedModel, variant: Variant) -> ServedModel:
    """The manifest behind a probe's server variant."""
    fail = served.failure_policy.model_dump(mode="python")
    # the warm-up is checked on the main server; with a queue of 1 or a 1 ms deadline it could never pass
    no_warmup = {**served.runtime.model_dump(mode="python"), "warmup": []}
    if variant == "overload":
        return served.with_changes(failure_policy={**fail, "max_queue": 1}, runtime=no_warmup)
    if variant == "deadline":
        return served.with_changes(failure_policy={**fail, "request_timeout_s": 0.001}, runtime=no_warmup)
    if variant == "uncached":
        post = {**served.postprocess.model_dump(mode="python")}
        post["response_cache"] = {**post["response_cache"], "enabled": False}
        return served.with_changes(postprocess=post)
    if variant == "unready":
        runtime = served.runtime.model_dump(mode="python")
        runtime["warmup"] = [{"prompt": "1+1=", "expect": "\u0000servegate-never", "max_tokens": 1}]
        return served.with_changes(runtime=runtime)
    return served
