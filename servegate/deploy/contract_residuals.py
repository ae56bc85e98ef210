"""The request contract no engine config can carry: limits, truncation, tenants, output contract, failure policy.

vLLM, Ray Serve LLM and KServe all expose vLLM's OpenAI server, which has none of these; servegate's gateway
(`gate serve` with `runtime.backend: endpoint` in front of the engine) enforces them.
"""

from __future__ import annotations

from servegate.contracts.manifest import ServedModel
from servegate.contracts.residual import Residual


def _gateway(path: str, value: object, reason: str) -> Residual:
    return Residual(path, value, "residual", "gateway", reason)


def _preprocess(served: ServedModel) -> list[Residual]:
    pre = served.preprocess
    out = [
        _gateway(
            "preprocess.max_input_tokens",
            pre.max_input_tokens,
            "vLLM bounds only prompt + output by max-model-len",
        ),
        _gateway("preprocess.max_payload_bytes", pre.max_payload_bytes, "vLLM parses bodies of any size (no 413)"),
        _gateway(
            "preprocess.truncation",
            pre.truncation,
            "vLLM refuses a prompt over max-model-len (400); it never truncates it"
            if pre.truncation != "reject"
            else "vLLM refuses only prompts over max-model-len, not over max_input_tokens",
        ),
    ]
    if pre.chat_template == "none":
        out.append(_gateway("preprocess.chat_template", "none", "vLLM has no plain 'role: content' template"))
    if pre.input_schema is not None:
        out.append(_gateway("preprocess.input_schema", pre.input_schema, "vLLM checks no extra request schema"))
    if pre.tenant_from != "none":
        out.append(_gateway("preprocess.tenant_from", pre.tenant_from, "vLLM knows no tenants"))
    if pre.unknown_fields == "reject":
        out.append(_gateway("preprocess.unknown_fields", "reject", "vLLM accepts unknown request fields and logs them"))
    return out


def _postprocess(served: ServedModel) -> list[Residual]:
    post = served.postprocess
    out = [
        _gateway(
            "postprocess.max_output_tokens",
            post.max_output_tokens,
            "vLLM caps max_tokens only by what max-model-len leaves",
        ),
        _gateway(
            "postprocess.async_result_ttl_s",
            post.async_result_ttl_s,
            "vLLM has no asynchronous requests (Prefer: respond-async)",
        ),
    ]
    if post.stop:
        out.append(_gateway("postprocess.stop", list(post.stop), "vLLM applies only the stop strings a request sends"))
    if post.output_schema is not None:
        out.append(_gateway("postprocess.output_schema", post.output_schema, "vLLM checks no output against a schema"))
    if post.max_output_bytes is not None:
        out.append(_gateway("postprocess.max_output_bytes", post.max_output_bytes, "vLLM limits tokens, never bytes"))
    cache = post.response_cache
    if cache.enabled:
        out.append(
            _gateway(
                "postprocess.response_cache",
                cache.model_dump(mode="json"),
                "vLLM caches KV blocks, never whole responses",
            )
        )
    return out


def _failure_policy(served: ServedModel) -> list[Residual]:
    fail = served.failure_policy
    out = [
        _gateway("failure_policy.request_timeout_s", fail.request_timeout_s, "vLLM has no per-request deadline"),
        _gateway("failure_policy.max_queue", fail.max_queue, "vLLM's waiting queue is unbounded"),
        _gateway("failure_policy.overload", fail.overload, "vLLM never sheds a request"),
        _gateway("failure_policy.overload_status", fail.overload_status, "vLLM never answers overloaded"),
        _gateway("failure_policy.retry_after_s", fail.retry_after_s, "vLLM sends no Retry-After"),
    ]
    if served.postprocess.output_schema is not None or served.postprocess.max_output_bytes is not None:
        out.append(_gateway("failure_policy.on_invalid_output", fail.on_invalid_output, "vLLM checks no output schema"))
    if fail.fallback is not None:
        out.append(
            _gateway(
                "failure_policy.fallback",
                fail.fallback.model_dump(mode="json"),
                "vLLM routes nothing to a second model",
            )
        )
    return out


def contract_residuals(served: ServedModel) -> list[Residual]:
    """The residuals of the request contract, enforced by the gateway whatever engine runs behind it."""
    out = _preprocess(served) + _postprocess(served) + _failure_policy(served)
    targets = served.capacity.targets
    if targets is not None:
        out.append(
            Residual(
                "capacity.targets",
                targets.model_dump(mode="json", exclude_none=True),
                "residual",
                "nowhere",
                "latency, throughput and memory targets are measured, not configured: "
                "`gate bench --url` against the deployment checks them",
            )
        )
    return out
