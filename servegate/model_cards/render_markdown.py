"""The serving note as Markdown: one numbered section per checklist item, tables for every set of figures.

The note's metadata (fingerprint, digests, times) rides in an HTML comment on the first line, so
`gate note --check` can judge a committed SERVING.md without its JSON twin. The same renderer writes
the model card's "Serving" section (`compact`: no JSON Schemas, headings one level deeper).
"""

from __future__ import annotations

import json
import re
from typing import Any

from servegate.contracts.units import format_bytes
from servegate.model_cards.evidence import NoteError
from servegate.model_cards.items_audits import render_output_length, render_timing_audits
from servegate.model_cards.items_load import render_load_checks
from servegate.model_cards.markdown_blocks import Raw, cell, code, details, fence, field_rows, table
from servegate.model_cards.note import ITEMS, ServingNote
from servegate.model_cards.render_capacity import render_capacity

META_PREFIX = "<!-- servegate-note "
_META = re.compile(r"<!-- servegate-note (\{.*?\}) -->", re.DOTALL)


def read_metadata(markdown: str) -> dict[str, Any]:
    """The metadata a note carries in its first-line comment; a NoteError when there is none."""
    match = _META.search(markdown)
    if match is None:
        raise NoteError("not a servegate serving note: the `<!-- servegate-note {...} -->` line is missing")
    try:
        data: dict[str, Any] = json.loads(match.group(1))
    except json.JSONDecodeError as exc:
        raise NoteError(f"the serving note's metadata line does not parse: {exc}") from None
    return data


# --- items ---------------------------------------------------------------------------------------


def _identity(item: dict[str, Any], h: str) -> list[str]:
    rows = [
        ("Public name", item.get("public_name")),
        ("Model class", item.get("model_class")),
        ("API model id", Raw(code(item["api_model_id"]))),
        ("Version", item["version"]),
        ("Fingerprint", Raw(code(item["fingerprint"]))),
        ("Weights", f"{item['weights_source']} ({item['weights_format']}, dtype {item['weights_dtype']})"),
        ("Intended use", item.get("intended_use")),
        ("License", item.get("license")),
    ]
    served_by = item.get("served_by") or {}
    if served_by.get("backend", "reference") != "reference":
        rows.append(("Served by", f"{served_by['engine']} ({served_by['backend']} backend)"))
    out = table(("Field", "Value"), rows)
    if served_by.get("enforced_in_front"):
        out += [
            f"The model runs on a remote engine. servegate enforces {', '.join(served_by['enforced_in_front'])} "
            "in front of it; these describe the remote and are declared, not verified: "
            + (", ".join(served_by["declared_not_verified"]) or "none")
            + ".",
            "",
        ]
    provenance = item.get("weights_provenance")
    if provenance:
        out += [
            f"Weights from the registry package {code(provenance['package'] + '==' + provenance['version'])} "
            f"({provenance['upstream']}, license {provenance['license']}): {code(provenance['file'])}, sha256 "
            f"{code(provenance['gguf_sha256'])}, {provenance['source_quantization']}, "
            + (
                "served from the GGUF file itself."
                if item.get("weights_format") == "gguf"
                else "dequantized to float32 by `gate zoo fetch`."
            ),
            "",
        ]
    out += _checkpoint_lines(item.get("weights_checkpoint"))
    out += [f"{h}# Weight checksums", "", f"sha256 of each weight file, {item['weight_checksums_origin']}.", ""]
    out += table(("File", "sha256"), ((Raw(code(f)), Raw(code(d))) for f, d in item["weight_checksums"].items()))
    return out


def _checkpoint_lines(checkpoint: dict[str, Any] | None) -> list[str]:
    """A quantized checkpoint's scheme, maker, calibration and parent, as one paragraph."""
    if not checkpoint:
        return []
    scheme = f"{checkpoint['format']} {checkpoint['scheme']}"
    if checkpoint.get("group_size"):
        scheme += f", groups of {checkpoint['group_size']} weights"
    if checkpoint.get("activations"):
        scheme += f", activations {checkpoint['activations']}"
    parts = [f"Quantized checkpoint: {scheme}"]
    parts.append(f"made by {checkpoint['toolchain']}" if checkpoint.get("toolchain") else "maker not recorded")
    calibration = checkpoint.get("calibration")
    if calibration:
        parts.append(
            f"calibrated on {code(calibration.get('file', '?'))} ({calibration.get('samples', '?')} samples, sha256 "
            f"{code(str(calibration.get('sha256', '?'))[:16])})"
        )
    if checkpoint.get("derived_from"):
        parts.append(f"gated against its parent {code(checkpoint['derived_from'])}")
    return ["; ".join(parts) + f". The reference runtime runs it with {checkpoint['executed_as']}.", ""]


def _error_table(rows: list[dict[str, Any]]) -> list[str]:
    return table(
        ("Code", "HTTP status", "Type", "Retryable", "When", "Applies here"),
        ((Raw(code(r["code"])), r["status"], r["type"], r["retryable"], r["when"], r["applies"]) for r in rows),
    )


_UNSEEDED = {
    "fresh": "sampled afresh for every request (as OpenAI and vLLM); temperature 0 is greedy",
    "deterministic": "seeded with runtime.seed: identical requests, identical text",
}


def _input(item: dict[str, Any], h: str, compact: bool) -> list[str]:
    limits = item["limits"]
    out = ["Endpoints: " + ", ".join(code(p) for p in item["endpoints"].values()) + ".", ""]
    out += [f"{h}# Limits", ""]
    out += table(
        ("Limit", "Value"),
        [
            ("Prompt length", f"{limits['max_input_tokens']:,} tokens"),
            ("Request body", f"{limits['max_payload_bytes']:,} bytes ({format_bytes(limits['max_payload_bytes'])})"),
            ("Context (prompt + output)", f"{limits['max_model_len_tokens']:,} tokens"),
            ("Output length", f"{limits['max_output_tokens']:,} tokens"),
            ("Choices per request (prompts x n)", limits.get("max_choices_per_request")),
            ("Truncation", Raw(f"**{item['truncation']['policy']}**: {cell(item['truncation']['meaning'])}")),
            ("Unknown request fields", item["unknown_fields"]),
            ("Sampling without a seed", _UNSEEDED.get(item.get("unseeded_sampling", ""))),
            ("Extra input schema", item["extra_input_schema"]),
            ("Tenant taken from", item["tenant_from"]),
            ("Chat template", item["chat_template"]),
        ],
    )
    out += [f"{h}# Errors for invalid input", "", "Every invalid input is answered with one of these (body below).", ""]
    out += _error_table(item["errors"])
    out += [f"{h}# Request fields", ""]
    for kind, schema in item["request_schemas"].items():
        out += [f"{kind.capitalize()} ({code(item['endpoints'][kind])}):", ""]
        out += table(("Field", "Type", "Limits", "Meaning"), field_rows(schema))
    if not compact:
        out += [f"{h}# Request schema", ""]
        for kind, schema in item["request_schemas"].items():
            out += details(f"{kind} request (JSON Schema)", fence("json", json.dumps(schema, indent=2)))
    return out


def _constraints(structured: dict[str, Any] | None) -> str:
    """The served output constraints in one cell."""
    if not structured:
        return "not served (response_format, structured_outputs and guided_* are refused)"
    forced = "; output_schema enforced on every request" if structured.get("output_schema_enforced") else ""
    return (
        f"{', '.join(structured['kinds'])}, up to {structured['max_spec_bytes']:,} bytes each, JSON whitespace "
        f"{structured['json_whitespace']}; enforced {structured['enforced']}{forced}"
    )


def _tool_calls(tools: dict[str, Any] | None) -> str:
    """Function calling in one cell."""
    if not tools:
        return "not served (tools and tool_choice are refused)"
    forced = f"; required and named calls {tools['forced_calls']}" if tools.get("forced_calls") else ""
    return (
        f"tool_choice {', '.join(tools['tool_choice'])}; calls read by the {tools['parser']} parser; up to "
        f"{tools['max_tools']} tools, {tools['max_spec_bytes']:,} bytes{forced}"
    )


def _output(item: dict[str, Any], h: str, compact: bool) -> list[str]:
    cache = item.get("response_cache")
    overload = item["overload"]
    rows = [
        ("Output schema", "JSON Schema (below)" if item.get("output_schema") else "free text"),
        ("Output constraints", _constraints(item.get("structured_output"))),
        ("Tool calls", _tool_calls(item.get("tools"))),
        (
            "Output that breaks the schema or its constraint",
            item["on_invalid_output"] if item.get("output_schema") or item.get("structured_output") else None,
        ),
        ("Output length", f"{item['max_output_tokens']:,} tokens at most"),
        ("Stop strings", ", ".join(item["stop"]) or None),
        ("Confidence (logprobs)", "offered on request" if item["logprobs_offered"] else "not offered"),
        ("Streaming", "server-sent events ending in `data: [DONE]`" if item["streaming"] else "no"),
        (
            "Response cache",
            f"on, {cache['scope']} scope, {cache['ttl_s']:g} s; a hit is marked (X-Servegate-Cache, response_cache)"
            if cache
            else "off",
        ),
        ("Fallback model", "on " + ", ".join(item["fallback"]["triggers"]) if item.get("fallback") else "none"),
        ("Deadline", f"{item['deadline_s']:g} s per request"),
        ("Overload", f"{overload['policy']} with HTTP {overload['status']}, Retry-After {overload['retry_after_s']} s"),
    ]
    out = table(("Property", "Value"), rows)
    if item.get("output_schema"):
        out += details("output JSON Schema", fence("json", json.dumps(item["output_schema"], indent=2)))
    err = item["error_format"]
    out += [
        f"{h}# Error format",
        "",
        "Every error has this OpenAI-shaped body, e.g. for a prompt that is too long:",
        "",
    ]
    out += fence("json", json.dumps(err["example"], indent=2))
    out += [f"{h}# Server-side errors", ""]
    out += _error_table(item["errors"])
    if not compact:
        for kind, schema in item["response_schemas"].items():
            out += details(f"{kind} response (JSON Schema)", fence("json", json.dumps(schema, indent=2)))
    return out


def _dist(d: dict[str, Any]) -> str:
    if d["distribution"] == "fixed":
        return f"fixed {d['mean']:,} tokens"
    return f"{d['distribution']}, mean {d['mean']:,} (min {d['min']:,}, max {d['max']:,}) tokens"


def _workload(item: dict[str, Any]) -> list[str]:
    ctx, bat = item["context"], item["batching"]
    rate = f"{item['rate_rps']:g} requests/s ({item['arrival']})" if item.get("rate_rps") else None
    if item.get("burstiness"):
        rate = f"{rate}, burstiness {item['burstiness']:g}"
    rows = [
        ("Context length", f"{ctx['max_model_len_tokens']:,} tokens (prompt + output)"),
        ("Prompt length", _dist(ctx["input_tokens"])),
        ("Output length", _dist(ctx["output_tokens"])),
        ("Batching", f"{bat['mode']}, up to {bat['max_batch_size']} sequences"),
        (
            "Tokens per step",
            f"{bat['max_num_batched_tokens']:,}" + (" (chunked prefill)" if bat["chunked_prefill"] else ""),
        ),
        ("Batch wait", f"{bat['max_wait_ms']:g} ms"),
        ("Queue", f"{bat['max_queue']:,} requests"),
        (
            "Concurrency",
            f"{item['concurrency']:,} requests in flight (closed loop)" if item.get("concurrency") else None,
        ),
        ("Request rate", rate),
        ("Response mode", item["response_mode"]),
    ]
    return [f"From {item['source']}.", "", *table(("Aspect", "Value"), rows)]


def _ci(r: dict[str, Any]) -> str | None:
    if r["ci_low"] is None and r["ci_high"] is None:
        return None
    level = f" ({100 * r['confidence']:g} %)" if r.get("confidence") else ""
    return f"[{cell(r['ci_low'])}, {cell(r['ci_high'])}]{level}"


def _quality(item: dict[str, Any], h: str) -> list[str]:
    out = [
        f"Overall verdict: **{item['verdict']}** (non-inferiority at {100 * item['confidence']:g} % confidence; "
        "a metric passes when the lower bound of candidate − baseline stays above −margin).",
        "",
    ]
    out += table(
        ("Gate", "Verdict", "Reason", "Failure examples", "of them public", "Simulated"),
        (
            (
                Raw(code(g["name"])),
                Raw(f"**{g['verdict']}**"),
                g["reason"],
                g["failure_examples"],
                g["public_failure_examples"],
                g["simulated"],
            )
            for g in item["gates"]
        ),
    )
    if item["scores"]:
        out += [f"{h}# Metrics", ""]
        out += table(
            ("Gate", "Suite", "Metric", "n", "Baseline", "Candidate", "Difference", "Interval", "Margin", "Verdict"),
            (
                (
                    r["gate"],
                    r["suite"],
                    r["metric"],
                    None if r["n"] is None else int(r["n"]),
                    r["baseline"],
                    r["candidate"],
                    r["difference"],
                    _ci(r),
                    r["margin"],
                    r["verdict"],
                )
                for r in item["scores"]
            ),
        )
    if item["agreement"]:
        out += [f"{h}# Token agreement", ""]
        out += table(
            ("Gate", "Suite", "Top-1 token agreement", "Mean KL (nats)"),
            ((r["gate"], r["suite"], r["token_agreement"], r["mean_kl"]) for r in item["agreement"]),
        )
    out += render_output_length(item.get("output_length") or [], h)
    out += [f"{h}# Optimizations in effect", "", "Where the served model differs from its reference form.", ""]
    out += table(
        ("Field", "Reference form", "Served", "Gates", "Simulated"),
        (
            (
                Raw(code(o["field"])),
                Raw(code(json.dumps(o["reference"]))),
                Raw(code(json.dumps(o["served"]))),
                ", ".join(f"{g} ({o['verdicts'][g]})" if g in o["verdicts"] else g for g in o["gates"]) or None,
                "not reported" if o["simulated"] is None else o["simulated"],
            )
            for o in item["optimizations"]
        ),
    )
    out += render_load_checks(item.get("under_load") or [], h)
    if item["examples"]:
        out += [f"{h}# Failure examples (public suites only)", ""]
        for e in item["examples"]:
            out += [f"- {code(e['gate'])} on suite {code(e['suite'])}, item {code(e.get('id'))}:", ""]
            for key in ("prompt", "reference", "baseline", "candidate"):
                if key in e:
                    out += [f"  - {key}: {code(e[key])}"]
            out += [""]
    return out


def _observability(item: dict[str, Any]) -> list[str]:
    out = [
        f"> {item['statement']}",
        "",
        f"Raw request text is logged: **{'yes' if item['raw_input_logged'] else 'no'}**.",
        "",
    ]
    out += [f"Metrics are exported at {item['metrics_endpoint']}; label values are {item['label_values']}.", ""]
    if "timing_audits" in item:
        out += render_timing_audits(item["timing_audits"])
    checks = item.get("client_side_checks") or []
    if checks:
        out += [f"Measured from the client side, with no internal counter: {', '.join(checks)}.", ""]
    if item["metrics"]:
        out += table(
            ("Metric", "Type", "What it counts"),
            (
                (Raw(", ".join(code(x) for x in m.get("series") or [m["name"]])), m["type"], m["help"])
                for m in item["metrics"]
            ),
        )
    return out


def render_items(note: ServingNote, level: int = 2, compact: bool = False, link_prefix: str = "") -> list[str]:
    """The seven numbered sections, headings at `level` (their subsections one deeper)."""
    h = "#" * level
    out: list[str] = []
    for number, (key, title) in enumerate(ITEMS, start=1):
        item = note.items[key]
        out += [f"{h} {number}. {title}", ""]
        if key == "model_identity":
            out += _identity(item, h)
        elif key == "input_contract":
            out += _input(item, h, compact)
        elif key == "output_contract":
            out += _output(item, h, compact)
        elif key == "workload_shape":
            out += _workload(item)
        elif key == "capacity_target":
            out += render_capacity(item, h, note.plots, link_prefix)
        elif key == "quality_gate":
            out += _quality(item, h)
        else:
            out += _observability(item)
    return out


def render_markdown(note: ServingNote) -> str:
    """The whole note: metadata line, title, provenance, the seven items."""
    meta = json.dumps(note.metadata(), sort_keys=True, separators=(",", ":"))
    lines = [
        f"{META_PREFIX}{meta} -->",
        f"# Serving note: {note.title} {note.version}",
        "",
        f"Written by servegate {note.servegate_version} from evidence on {note.written_at}; "
        f"gate results from {note.gate_results_at[:19].replace('T', ' ')} UTC. Fingerprint {code(note.fingerprint)}, "
        f"gate verdict **{note.verdict}**. Regenerate with `gate note`; `gate note --check` tells when it is stale.",
        "",
    ]
    lines += render_items(note, level=2)
    return "\n".join(lines).rstrip("\n") + "\n"
