"""`gate verify` of a llama-server: what /props and /slots say, against what the manifest maps to.

llama-server reports its launch settings itself: `/props` (the model file, slots, each slot's context, the chat
template, the default sampling settings, its build) and `/slots` (one entry per slot, with its context). These
checks run only when the deployment answers `/props` as llama-server does; each is a plain tuple that
deploy/verify.py turns into a result like its own checks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePath
from typing import Any

import httpx

from servegate.contracts.manifest import ServedModel
from servegate.runtime.remote.llamacpp_args import NEUTRAL_SAMPLING

Fact = tuple[str, bool | None, str, str, Any, Any]
"""(manifest field, ok (None: skipped), reason, source, declared, observed)."""


def json_of(response: httpx.Response | None) -> Any:
    """The JSON of a 200 answer; None for a failed request, another status or a body that is not JSON."""
    if response is None or response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _same(path: str, declared: Any, observed: Any, source: str) -> Fact:
    if observed is None:
        return (path, None, f"{source} does not say", source, declared, None)
    ok = declared == observed
    return (
        path,
        ok,
        f"{observed!r} as declared" if ok else f"manifest {declared!r}, served {observed!r}",
        source,
        declared,
        observed,
    )


def _context(served: ServedModel, per_slot: Any) -> Fact:
    """Each slot must hold max_model_len tokens (llama.cpp rounds a slot's context up, so more is fine)."""
    source, length = "GET /props default_generation_settings.n_ctx", served.runtime.max_model_len
    if not isinstance(per_slot, int):
        return ("runtime.max_model_len", None, "the slot context is not reported", source, length, None)
    ok = per_slot >= length
    reason = f"each slot holds {per_slot} tokens" + (f" (>= {length})" if ok else f", fewer than {length}")
    return ("runtime.max_model_len", ok, reason, source, length, per_slot)


def _template(served: ServedModel, reported: Any) -> Fact | None:
    template = served.preprocess.chat_template
    if template in ("tokenizer", "none"):
        return None
    source = "GET /props chat_template"
    text = served.resolve_path(template).read_text(encoding="utf-8")
    if not isinstance(reported, str):
        return ("preprocess.chat_template", None, "the template is not reported", source, template, None)
    ok = reported.strip() == text.strip()
    reason = "the manifest's template file" if ok else "another template than the manifest's file"
    return ("preprocess.chat_template", ok, reason, source, template, f"{len(reported)} characters")


def llamacpp_facts(served: ServedModel, get: Callable[[str], httpx.Response | None]) -> list[Fact]:
    """The llama-server checks (none when the deployment is not a llama-server)."""
    props = json_of(get("/props"))
    if not isinstance(props, dict) or not isinstance(props.get("default_generation_settings"), dict):
        return []
    settings = props["default_generation_settings"]
    slots = 1 if served.batching.mode == "none" else served.batching.max_batch_size
    facts = [_same("batching.max_batch_size", slots, props.get("total_slots"), "GET /props total_slots")]
    facts.append(_context(served, settings.get("n_ctx")))
    model_path = props.get("model_path")
    if served.weights.gguf_file is not None:
        observed = PurePath(str(model_path)).name if model_path else None
        facts.append(_same("weights.gguf_file", served.weights.gguf_file, observed, "GET /props model_path"))
    template = _template(served, props.get("chat_template"))
    if template is not None:
        facts.append(template)
    params = settings.get("params") if isinstance(settings.get("params"), dict) else {}
    facts.append(_same("runtime.seed", served.runtime.seed, params.get("seed"), "GET /props params.seed"))
    sampling = {k: params.get(k) for k in NEUTRAL_SAMPLING}
    ok = all(isinstance(v, (int, float)) and abs(float(v) - NEUTRAL_SAMPLING[k]) < 1e-6 for k, v in sampling.items())
    reason = "neutral: temperature 0 is greedy" if ok else "not neutral: requests that leave them out are reshaped"
    facts.append(
        (
            "runtime.backend",
            ok,
            f"default sampling {sampling} {reason}",
            "GET /props params",
            NEUTRAL_SAMPLING,
            sampling,
        )
    )
    listed = json_of(get("/slots"))
    if isinstance(listed, list):
        contexts = sorted({int(s["n_ctx"]) for s in listed if isinstance(s, dict) and isinstance(s.get("n_ctx"), int)})
        facts.append(
            (
                "batching.max_batch_size",
                len(listed) == slots,
                f"{len(listed)} slots, contexts {contexts}",
                "GET /slots",
                slots,
                len(listed),
            )
        )
    return facts
