"""The serving note's capacity item as Markdown: targets against predictions and measurements, then the
cost, the capacity plan, the bench run and the plots, each a subsection when its evidence is there."""

from __future__ import annotations

from typing import Any

from servegate.model_cards.markdown_blocks import code, fmt, table


def render_capacity(item: dict[str, Any], h: str, plots: list[dict[str, str]], link_prefix: str) -> list[str]:
    """The capacity item (subsection headings one level below `h`; plot links prefixed with `link_prefix`)."""
    out = _targets(item)
    if item.get("cost"):
        out += _cost(item["cost"], h)
    if item.get("plan"):
        out += _plan(item["plan"], h)
    if item.get("bench"):
        out += _bench(item["bench"], h)
    if plots:
        out += [f"{h}# Plots", ""]
        out += [f"![{p['title']}]({link_prefix}{p['path']})" for p in plots] + [""]
    return out


def _targets(item: dict[str, Any]) -> list[str]:
    """Where targets, predictions and measurements come from, one row per metric, and what the bench supports."""
    src = item["sources"]
    out = [
        "Targets from "
        + (src["target"] or "—")
        + "; predicted by "
        + (code(src["predicted"]) if src["predicted"] else "—")
        + "; measured by "
        + (code(src["measured"]) if src["measured"] else "—")
        + ".",
        "",
    ]
    out += table(
        ("Metric", "Target", "Predicted", "Measured", "Met"),
        (
            (
                r["metric"],
                ("≥ " if r["higher_is_better"] else "≤ ") + fmt(r["target"], r["unit"])
                if r["target"] is not None
                else None,
                fmt(r["predicted"], r["unit"]),
                fmt(r["measured"], r["unit"]),
                r["met"],
            )
            for r in item["rows"]
        ),
    )
    if item.get("supported"):
        out += ["What the measurements support:", "", *(f"- {line}" for line in item["supported"]), ""]
    return out


def _cost(c: dict[str, Any], h: str) -> list[str]:
    """Cost per replica-hour, per 1,000 requests and per 1M output tokens."""
    cur = c["currency"]
    return [f"{h}# Cost", ""] + table(
        ("Unit", "Cost"),
        [
            ("one replica-hour", f"{c['per_replica_hour']:,.4g} {cur}"),
            ("1,000 requests", f"{c['per_1k_requests']:,.4g} {cur}" if c.get("per_1k_requests") else None),
            (
                "1M output tokens",
                f"{c['per_1m_output_tokens']:,.4g} {cur}" if c.get("per_1m_output_tokens") else None,
            ),
        ],
    )


def _plan(plan: dict[str, Any], h: str) -> list[str]:
    """The capacity plan's sentence, its memory figures, what binds and the recommended policy."""
    out = [f"{h}# Capacity plan", ""]
    if plan.get("sentence"):
        out += [str(plan["sentence"]), ""]
    rows: list[tuple[str, Any]] = [
        ("Weights", fmt(plan.get("weights_bytes"), "bytes")),
        (
            "KV cache per token",
            f"{plan['kv_bytes_per_token']:,.0f} bytes" if plan.get("kv_bytes_per_token") else None,
        ),
        ("Concurrent sequences that fit", plan.get("max_concurrent_sequences")),
        ("Binding constraint", plan.get("binding_constraint")),
        ("Bound by", plan.get("bound")),
    ]
    rows += [(f"policy: {k}", v) for k, v in (plan.get("policy") or {}).items()]
    return out + table(("Figure", "Value"), rows)


def _bench(bench: dict[str, Any], h: str) -> list[str]:
    """The bench run: requests sent and failed, goodput, the share meeting the SLOs, runs."""
    goodput = bench.get("goodput_requests_per_s")
    share = bench.get("goodput_fraction")
    return [f"{h}# Bench run", ""] + table(
        ("Figure", "Value"),
        [
            ("Requests sent", bench.get("requests_sent")),
            ("Requests failed", bench.get("requests_failed")),
            ("Goodput", f"{goodput:.3g} requests/s" if goodput is not None else None),
            ("Share meeting the SLOs", f"{100 * share:.1f} %" if share is not None else None),
            ("Runs", bench.get("runs")),
        ],
    )
