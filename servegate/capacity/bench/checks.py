"""What a bench checks about its own run before its figures are believed: failures, the workload's shape, the client.

- failures: requests that did not complete, counted by class; beyond a declared share the bench fails;
- workload shape: the prompt and output tokens each response's `usage` reports against what was asked
  (a server that truncated prompts, stopped before `max_tokens` although `ignore_eos` was set, or
  counts differently from what it streamed is named);
- the client: how late each request was sent against its schedule (dispatch delay) and whether the
  offered rate was achieved; a client that falls behind measures itself, not the server.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from servegate.capacity.bench.run_metrics import RequestRecord

CLIENT_DELAY_SHARE = 0.01
"""The client is the limit when its mean dispatch delay passes this share of TTFT p50 (guidellm's rule)."""

RATE_ACHIEVED_SHARE = 0.95
"""The offered rate counts as achieved when requests went out at no less than this share of the scheduled rate."""


def failures(records: Sequence[RequestRecord], max_share: float = 0.0) -> dict[str, Any]:
    """Failed requests by class, their share of those sent, and whether it exceeds `max_share`."""
    failed = [r for r in records if not r.ok]
    by_class = Counter(r.error_class or (r.error and r.error[:60]) or "no output token" for r in failed)
    share = len(failed) / len(records) if records else 0.0
    return {
        "failed": len(failed),
        "sent": len(records),
        "share": share,
        "max_share": max_share,
        "exceeded": share > max_share,
        "by_class": dict(by_class.most_common()),
    }


def failure_sentence(f: dict[str, Any]) -> str:
    """`60 of 60 requests failed (100.0%, more than the 0.0% allowed): HTTP 400 too_long x 60`."""
    classes = ", ".join(f"{name} x {count}" for name, count in f["by_class"].items())
    allowed = "more than" if f["exceeded"] else "within"
    return (
        f"{f['failed']} of {f['sent']} requests failed ({100 * f['share']:.1f}%, {allowed} the "
        f"{100 * f['max_share']:.1f}% allowed by --max-error-share): {classes}"
    )


def workload_shape(records: Sequence[RequestRecord], *, ignore_eos: bool, exact_prompts: bool) -> dict[str, Any]:
    """The tokens each completed response reported against what the workload asked for."""
    done = [r for r in records if r.ok]
    usage = [r for r in done if r.usage_output_tokens is not None]
    prompt_usage = [r for r in done if r.usage_prompt_tokens is not None]
    stopped = [r for r in done if ignore_eos and r.output_tokens < r.requested_output_tokens]
    over_max = [r for r in usage if (r.usage_output_tokens or 0) > r.requested_output_tokens]
    # a streamed chunk carries at least one token: more chunks than counted tokens is a miscount
    chunks_over = [r for r in usage if r.chunks > (r.usage_output_tokens or 0)]
    truncated = [r for r in prompt_usage if (r.usage_prompt_tokens or 0) < r.requested_prompt_tokens]
    mismatched = [r for r in prompt_usage if r.usage_prompt_tokens != r.requested_prompt_tokens]
    out: dict[str, Any] = {
        "completed": len(done),
        "usage_reported": len(usage),
        "ignore_eos": ignore_eos,
        "exact_prompts": exact_prompts,
        "output_tokens": {
            "requested": sum(r.requested_output_tokens for r in done),
            "reported": sum(r.usage_output_tokens or 0 for r in usage) if usage else None,
            "streamed_chunks": sum(r.chunks for r in done),
        },
        "prompt_tokens": {
            "requested": sum(r.requested_prompt_tokens for r in done),
            "reported": sum(r.usage_prompt_tokens or 0 for r in prompt_usage) if prompt_usage else None,
        },
        "stopped_early": len(stopped),
        "output_tokens_missing": sum(r.requested_output_tokens - r.output_tokens for r in stopped),
        "over_max_tokens": len(over_max),
        "chunks_over_usage": len(chunks_over),
        "prompt_mismatch": len(mismatched) if exact_prompts else None,
        "prompt_truncated": len(truncated) if exact_prompts else None,
    }
    out["achieved"] = not (stopped or over_max or chunks_over or (exact_prompts and mismatched))
    return out


def shape_warnings(shape: dict[str, Any], server: str) -> list[str]:
    """One sentence per way the workload's shape was not achieved, naming the server."""
    out: list[str] = []
    n = shape["completed"]
    if shape["stopped_early"]:
        out.append(
            f"{server} stopped {shape['stopped_early']} of {n} responses before max_tokens although ignore_eos was "
            f"set ({shape['output_tokens_missing']} output tokens short): the workload's output lengths were not run"
        )
    if shape["over_max_tokens"]:
        out.append(f"{server} reported more completion tokens than max_tokens in {shape['over_max_tokens']} of {n}")
    if shape["chunks_over_usage"]:
        out.append(
            f"{server} streamed more output chunks than the completion tokens its usage reports in "
            f"{shape['chunks_over_usage']} of {n} responses: it miscounts usage"
        )
    if shape["exact_prompts"] and shape["prompt_mismatch"]:
        p = shape["prompt_tokens"]
        out.append(
            f"{server} counted other prompt lengths than the tokenizer's in {shape['prompt_mismatch']} of {n} "
            f"({shape['prompt_truncated']} shorter: truncated?); prompt tokens requested {p['requested']}, "
            f"reported {p['reported']}"
        )
    if n and not shape["usage_reported"]:
        out.append(f"{server} reported no usage: token counts are streamed chunks, which may hold several tokens")
    return out


def client_checks(records: Sequence[RequestRecord], summary: dict[str, Any]) -> dict[str, Any]:
    """Dispatch delay against TTFT p50, and the send rate achieved against the schedule's."""
    delays = np.array([d for r in records if (d := r.dispatch_delay) is not None], dtype=float) * 1000
    ttft_p50 = float(summary["ttft_ms"]["p50"]) if summary["ttft_ms"]["count"] else float("nan")
    mean = float(delays.mean()) if delays.size else 0.0
    out: dict[str, Any] = {
        "dispatch_delay_mean_ms": mean,
        "dispatch_delay_p99_ms": float(np.percentile(delays, 99)) if delays.size else 0.0,
        "ttft_p50_ms": ttft_p50,
        "delay_limit_ms": CLIENT_DELAY_SHARE * ttft_p50,
        "scheduled_rate_rps": None,
        "achieved_rate_rps": None,
        "reasons": [],
    }
    if mean > out["delay_limit_ms"]:  # nan limit (no TTFT) compares False: nothing to say
        out["reasons"].append(
            f"the client sent requests {mean:.3g} ms late on average, over {100 * CLIENT_DELAY_SHARE:g}% of "
            f"TTFT p50 ({ttft_p50:.3g} ms)"
        )
    sent = sorted(r.sent for r in records if r.sent is not None)
    scheduled = sorted(r.scheduled for r in records)
    if len(sent) > 1 and scheduled[-1] > scheduled[0] and sent[-1] > sent[0]:
        wanted = (len(scheduled) - 1) / (scheduled[-1] - scheduled[0])
        got = (len(sent) - 1) / (sent[-1] - sent[0])
        out["scheduled_rate_rps"], out["achieved_rate_rps"] = wanted, got
        if got < RATE_ACHIEVED_SHARE * wanted:
            out["reasons"].append(f"the client sent {got:.3g} requests/s of the {wanted:.3g} scheduled")
    out["client_limited"] = bool(out["reasons"])
    return out


def client_warning(client: dict[str, Any]) -> str | None:
    """The warning for a client-limited run (None when the client kept up)."""
    if not client.get("client_limited"):
        return None
    return "client-limited: " + "; ".join(client["reasons"]) + " (these figures include the client's own delay)"
