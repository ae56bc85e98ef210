"""Checklist items 1-3, read from the manifest and the contract: model identity, input and output contracts."""

from __future__ import annotations

from typing import Any

from servegate.contracts.errors import CATALOGUE, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.remote_scope import remote_scope
from servegate.contracts.request_models import Endpoint
from servegate.model_cards.evidence import missing

_FORMAT_SUFFIXES = {"gguf": (".gguf",), "pickle": (".bin", ".pt", ".pth")}
"""The weight files a format loads (any other: safetensors); a folder may hold more than one format's."""
_TRUNCATION = {
    "reject": "over-long prompts are refused with input_too_long (400); nothing is cut",
    "left": "over-long prompts lose their oldest tokens (the start) until they fit",
    "right": "over-long prompts lose their newest tokens (the end) until they fit",
    "middle": "over-long prompts lose tokens from the middle; start and end are kept",
}
_WHEN = {
    "invalid_request": "a field has the wrong type or range, breaks a manifest limit or the extra input schema",
    "unknown_parameter": "the body has a field the API does not know (preprocess.unknown_fields: reject)",
    "unsupported_parameter": "the body asks for an answer-changing feature servegate does not implement (best_of, ...)",
    "input_too_long": "the prompt is longer than preprocess.max_input_tokens (truncation: reject)",
    "payload_too_large": "the body is larger than preprocess.max_payload_bytes",
    "unsupported_media": "the Content-Type is not application/json",
    "not_found": "the model name or the path is not served here",
    "invalid_constraint": "an output constraint is larger than structured_output.max_spec_bytes or does not compile",
    "invalid_output": "the output breaks postprocess.output_schema or its output constraint (on_invalid_output: error)",
    "overloaded": "the queue is full (failure_policy.max_queue)",
    "deadline_exceeded": "the request ran past failure_policy.request_timeout_s",
    "model_unavailable": "the model is loading, failed warm-up or is draining",
    "internal": "a bug; the body carries an incident id, never request text",
}


def endpoints(served: ServedModel) -> dict[Endpoint, str]:
    """Request kind -> HTTP path served for this manifest's task."""
    if served.preprocess.task == "embed":
        return {"embeddings": "/v1/embeddings"}
    return {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def _public_source(source: str) -> str:
    """The weights' source as the note may publish it: zoo and hub ids as written, local paths not at all."""
    if source.startswith(("zoo:", "hf:")):
        return source
    return "local checkpoint (path not published)"


def zoo_fetch_spec(name: str) -> dict[str, Any] | None:
    """Where a fetched zoo model comes from (package, version, file, GGUF sha256, source quantization,
    license, upstream), from the catalogue; None for a model that ships with servegate or is unknown."""
    from servegate.zoo.catalog import read_index

    try:
        spec = read_index()[name].get("fetch")
    except (OSError, KeyError, ValueError):
        return None
    return {k: v for k, v in spec.items() if k != "wheel_mib"} if isinstance(spec, dict) else None


def _provenance(source: str) -> dict[str, Any] | None:
    """A fetched zoo model's provenance for the note; None for any other weights source."""
    return zoo_fetch_spec(source.removeprefix("zoo:")) if source.startswith("zoo:") else None


def _zoo_files(name: str, fetched: bool) -> dict[str, str]:
    """A zoo model's recorded file checksums; {} when there are none to read (not built, not fetched)."""
    from servegate.zoo.catalog import recorded_files, zoo_model_path
    from servegate.zoo.errors import ZooError

    try:
        return recorded_files(name, zoo_model_path(name) if fetched else None)
    except (OSError, KeyError, ValueError, ZooError):
        return {}


def weight_checksums(served: ServedModel, *, hash_files: bool = True) -> tuple[dict[str, str], str]:
    """(file -> sha256, where they come from): declared in the manifest, the zoo's catalogue, or hashed here.

    With `hash_files=False` local weight files are only found, not hashed (an empty map when there are some):
    what `gate check --note` asks before gating, so a large checkpoint is read once, when the note is written.
    """
    w = served.weights
    if w.sha256:
        return dict(sorted(w.sha256.items())), "declared in weights.sha256 and verified before load"
    suffixes = _FORMAT_SUFFIXES.get(w.format, (".safetensors",))
    if w.source.startswith("zoo:"):
        name = w.source.removeprefix("zoo:")
        fetched = zoo_fetch_spec(name) is not None
        weights = {f: d for f, d in _zoo_files(name, fetched).items() if f.endswith(suffixes)}
        if w.gguf_file is not None:
            weights = {f: d for f, d in weights.items() if f == w.gguf_file}
        if weights:
            made = "recorded when `gate zoo fetch` converted it" if fetched else "recorded in servegate's zoo catalogue"
            return dict(sorted(weights.items())), made
        fix = f"gate zoo fetch {name}" if fetched else f"gate zoo build {name}"
        raise missing(
            "model identity (weight checksums)",
            f"zoo model {name!r} has no recorded checksums: run `{fix}`, or declare weights.sha256",
        )
    if w.source.startswith("hf:"):
        raise missing(
            "model identity (weight checksums)",
            "declare weights.sha256 (file -> sha256) for hub weights; they are verified before load",
        )
    from servegate.zoo.catalog import sha256_file

    root = served.resolve_path(w.source)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(suffixes)) if root.is_dir() else []
    if not files:
        raise missing(
            "model identity (weight checksums)",
            f"no weight files found under weights.source ({root}); fix the source or declare weights.sha256",
        )
    if not hash_files:
        return {}, "computed from the weight files"
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in files}, "computed from the weight files"


def model_identity(served: ServedModel, *, hash_files: bool = True) -> dict[str, Any]:
    """Item 1: public name or model class, version, fingerprint, weight checksums (see weight_checksums)."""
    card = served.card
    if not (card.public_name or card.model_class):
        raise missing(
            "model identity",
            "set card.public_name (the published name) or card.model_class (a generic class) in the manifest",
        )
    checksums, origin = weight_checksums(served, hash_files=hash_files)
    return {
        "public_name": card.public_name,
        "model_class": card.model_class,
        "api_model_id": served.name,
        "version": served.version,
        "fingerprint": served.fingerprint,
        "weights_source": _public_source(served.weights.source),
        "weights_format": served.weights.format,
        "weights_dtype": served.weights.dtype,
        "weight_checksums": checksums,
        "weight_checksums_origin": origin,
        "intended_use": card.intended_use,
        "license": card.license,
        "served_by": served_by(served),
        "weights_provenance": _provenance(served.weights.source),
        "weights_checkpoint": checkpoint_identity(served),
    }


def checkpoint_identity(served: ServedModel) -> dict[str, Any] | None:
    """A toolchain checkpoint's scheme, maker, calibration and parent as the note may publish them (local paths
    left out); None for weights that are not a quantized checkpoint."""
    from servegate.runtime.model.weights import served_scheme

    scheme = served_scheme(served)
    if scheme is None:
        return None
    calibration = scheme.calibration or {}
    parent = None
    if served.weights.derived_from is not None:
        parent = _public_source(served.parent_weights()[0].source)
    return {
        "format": scheme.format,
        "scheme": scheme.scheme,
        "group_size": scheme.group_size,
        "activations": scheme.activations,
        "toolchain": scheme.toolchain,
        "calibration": {k: calibration[k] for k in ("file", "sha256", "samples") if k in calibration} or None,
        "executed_as": scheme.executed_as,
        "derived_from": parent,
    }


def served_by(served: ServedModel) -> dict[str, Any]:
    """Which engine runs the model and, for a remote, which fields servegate enforces in front of it."""
    scope = remote_scope(served)
    engine = served.runtime.engine
    if scope is None:
        return {"backend": "reference", "engine": "servegate reference runtime"}
    reported = "as reported by the remote at gate time"
    return {
        "backend": served.runtime.backend,
        "engine": f"{engine.name} {engine.version or ''}".strip() if engine else reported,
        "enforced_in_front": sorted(scope["enforced_in_front"]),
        "declared_not_verified": sorted(scope["declared_not_verified"]),
    }


def _error_rows(served: ServedModel, client: bool) -> list[dict[str, Any]]:
    rows = []
    for spec in CATALOGUE.values():
        if spec.client_error != client:
            continue
        status = served.failure_policy.overload_status if spec.code == "overloaded" else spec.status
        applies = True
        if spec.code == "input_too_long":
            applies = served.preprocess.truncation == "reject"
        if spec.code == "unknown_parameter":
            applies = served.preprocess.unknown_fields == "reject"
        checked = served.postprocess.output_schema is not None or served.postprocess.structured_output is not None
        if spec.code == "invalid_output":
            applies = checked and served.failure_policy.on_invalid_output == "error"
        if spec.code == "invalid_constraint":
            applies = served.postprocess.structured_output is not None
        rows.append(
            {
                "code": spec.code,
                "status": status,
                "type": spec.type,
                "retryable": spec.retryable,
                "when": _WHEN.get(spec.code, spec.template),
                "applies": applies,
            }
        )
    return rows


def input_contract(served: ServedModel) -> dict[str, Any]:
    """Item 2: request schema, limits in tokens and bytes, truncation policy, every invalid-input error."""
    from servegate.contracts.requests import request_json_schema

    pre, rt, post = served.preprocess, served.runtime, served.postprocess
    return {
        "task": pre.task,
        "endpoints": endpoints(served),
        "request_schemas": {kind: request_json_schema(served, kind) for kind in endpoints(served)},
        "limits": {
            "max_input_tokens": pre.max_input_tokens,
            "max_payload_bytes": pre.max_payload_bytes,
            "max_model_len_tokens": rt.max_model_len,
            "max_output_tokens": post.max_output_tokens,
            "max_choices_per_request": pre.max_choices_per_request,
        },
        "truncation": {"policy": pre.truncation, "meaning": _TRUNCATION[pre.truncation]},
        "unknown_fields": pre.unknown_fields,
        "unseeded_sampling": pre.unseeded_sampling,
        "extra_input_schema": pre.input_schema is not None,
        "tenant_from": pre.tenant_from,
        "chat_template": pre.chat_template if pre.chat_template in ("tokenizer", "none") else "custom template",
        "errors": _error_rows(served, client=True),
    }


def _structured(served: ServedModel) -> dict[str, Any] | None:
    """The output constraints served: kinds, the request fields that carry them, limits, how they are enforced."""
    structured = served.postprocess.structured_output
    if structured is None:
        return None
    on_remote = served.runtime.remote
    return {
        "kinds": list(structured.kinds),
        "request_fields": [
            "response_format",
            "structured_outputs",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
        ],  # fmt: skip
        "max_spec_bytes": structured.max_spec_bytes,
        "json_whitespace": structured.whitespace,
        "enforced": "by the remote engine, and each ended answer checked here"
        if on_remote
        else f"as a token mask ({structured.backend}), and each ended answer checked again",
        "output_schema_enforced": structured.enforce_output_schema,
    }


def _tools(served: ServedModel) -> dict[str, Any] | None:
    """Function calling as served: the tool_choice modes, the parser of calls, the limits."""
    tools = served.postprocess.tools
    if tools is None:
        return None
    return {
        "tool_choice": list(tools.tool_choice),
        "parser": tools.parser,
        "max_tools": tools.max_tools,
        "max_spec_bytes": tools.max_spec_bytes,
        "forced_calls": "decoded under the grammar engine (always parse)"
        if {"required", "named"} & set(tools.tool_choice)
        else None,
    }


def output_contract(served: ServedModel) -> dict[str, Any]:
    """Item 3: output schema, logprobs if offered, the error format, and the server-side errors."""
    from servegate.contracts.responses import response_json_schema

    post, fail = served.postprocess, served.failure_policy
    kinds = ["embeddings"] if served.preprocess.task == "embed" else ["completions", "chat", "chat_chunk"]
    example = ServingError(
        "input_too_long",
        param="prompt",
        tokens=served.preprocess.max_input_tokens + 1,
        limit=served.preprocess.max_input_tokens,
    )
    cache = post.response_cache
    return {
        "response_schemas": {kind: response_json_schema(kind) for kind in kinds},
        "output_schema": post.output_schema,
        "structured_output": _structured(served),
        "tools": _tools(served),
        "on_invalid_output": fail.on_invalid_output,
        "max_output_tokens": post.max_output_tokens,
        "stop": list(post.stop),
        "logprobs_offered": post.logprobs,
        "streaming": served.preprocess.task != "embed",
        "response_cache": {
            "enabled": cache.enabled,
            "scope": cache.scope,
            "ttl_s": cache.ttl_s,
            "marked": "X-Servegate-Cache header and response_cache body field: hit, miss or partial",
        }
        if cache.enabled
        else None,
        "fallback": {"triggers": list(fail.fallback.triggers)} if fail.fallback else None,
        "deadline_s": fail.request_timeout_s,
        "overload": {"policy": fail.overload, "status": fail.overload_status, "retry_after_s": fail.retry_after_s},
        "error_format": {
            "schema": response_json_schema("error"),
            "example": example.to_body(),
            "status": example.status,
        },
        "errors": _error_rows(served, client=False),
    }
