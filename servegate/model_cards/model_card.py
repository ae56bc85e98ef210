"""The Hugging Face model card's "Serving" section and its `model-index` results, through huggingface_hub.

The section sits between two HTML comment markers and is replaced in place on every run (appended
at the end the first time); the rest of the card's text is left byte for byte. The gated variant's
public suite scores go into `model-index` as EvalResults whose `args` carry the serving configuration
they were measured under; results servegate wrote before are replaced, everyone else's are kept.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, cast

from servegate.contracts.manifest import ServedModel
from servegate.model_cards.evidence import NoteError
from servegate.model_cards.note import ServingNote

START = "<!-- servegate:serving:start -->"
END = "<!-- servegate:serving:end -->"
SECTION_TITLE = "Serving"


def serving_configuration(served: ServedModel) -> dict[str, Any]:
    """The serving settings that change what users get, as recorded with each eval result."""
    rt, pre, post, bat = served.runtime, served.preprocess, served.postprocess, served.batching
    kv = rt.kv_cache
    return {
        "fingerprint": served.fingerprint,
        "version": served.version,
        "dtype": rt.dtype,
        "quantization": rt.quantization.method,
        "kv_cache_dtype": kv.dtype if kv else None,
        "prefix_caching": kv.prefix_caching if kv else False,
        "batching": bat.mode,
        "max_batch_size": bat.max_batch_size,
        "max_input_tokens": pre.max_input_tokens,
        "truncation": pre.truncation,
        "max_model_len": rt.max_model_len,
        "max_output_tokens": post.max_output_tokens,
        "response_cache": post.response_cache.enabled,
        "fallback": served.failure_policy.fallback is not None,
    }


def _round(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def eval_results(note: ServingNote, served: ServedModel) -> list[Any]:
    """One EvalResult per public suite and metric: the served (gated) variant's score and how it was served."""
    from huggingface_hub import EvalResult

    suites = {s.name: s for s in served.quality.suites if s.public}
    task = "feature-extraction" if served.preprocess.task == "embed" else "text-generation"
    config = serving_configuration(served)
    out, seen = [], set()
    for row in note.items["quality_gate"]["scores"]:
        suite = suites.get(row["suite"])
        if suite is None or row["candidate"] is None or not row["metric"] or (suite.name, row["metric"]) in seen:
            continue
        seen.add((suite.name, row["metric"]))
        gate = {k: _round(row[k]) for k in ("baseline", "difference", "margin", "verdict") if row.get(k) is not None}
        if row.get("ci_low") is not None and row.get("ci_high") is not None:
            gate["interval"] = [_round(row["ci_low"]), _round(row["ci_high"])]
        out.append(
            EvalResult(
                task_type=task,
                dataset_type=suite.dataset,
                dataset_name=suite.name,
                dataset_split=suite.split,
                metric_type=row["metric"],
                metric_value=row["candidate"],
                metric_name=f"{row['metric']} (served, {served.fingerprint[:12]})",
                metric_args={
                    "servegate": note.servegate_version,
                    "serving": config,
                    "gate": {"name": row["gate"], **gate},
                },
                verified=False,
            )
        )
    return out


def _is_ours(result: Any) -> bool:
    args = result.metric_args
    return isinstance(args, dict) and "servegate" in args and isinstance(args.get("serving"), dict)


def serving_section(note: ServingNote, link_prefix: str, note_link: str) -> str:
    """The card's section: the seven items in compact form, headings under `## Serving`."""
    from servegate.model_cards.markdown_blocks import code
    from servegate.model_cards.render_markdown import render_items

    lines = [
        START,
        f"## {SECTION_TITLE}",
        "",
        "How this model is served, written by servegate from what it measured "
        f"(fingerprint {code(note.fingerprint[:12])}, gate verdict **{note.verdict}**). "
        f"Full serving note: [{note_link}]({note_link}).",
        "",
        *render_items(note, level=3, compact=True, link_prefix=link_prefix),
    ]
    return "\n".join(lines).rstrip("\n") + "\n" + END


def _replace_section(text: str, section: str) -> str:
    starts, ends = text.count(START), text.count(END)
    if starts == 0 and ends == 0:
        return text.rstrip("\n") + "\n\n" + section + "\n" if text.strip() else section + "\n"
    if starts != 1 or ends != 1 or text.index(START) > text.index(END):
        raise NoteError(
            f"the model card's serving markers are broken ({starts} start, {ends} end): keep exactly one "
            f"{START} before one {END}, or remove both"
        )
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + section + tail


def update_model_card_text(
    card_text: str, note: ServingNote, served: ServedModel, note_path: Path, card_dir: Path
) -> str:
    """The card with its Serving section inserted or replaced and servegate's eval results in model-index."""
    from huggingface_hub import ModelCard, ModelCardData

    logging.getLogger("huggingface_hub.repocard").setLevel(logging.ERROR)  # "no metadata block" is expected here
    try:
        card = ModelCard(card_text, ignore_metadata_errors=False) if card_text.strip() else ModelCard("")
    except Exception as exc:  # noqa: BLE001 - huggingface_hub raises ValueError or yaml errors
        raise NoteError(f"the model card does not parse as a Hugging Face model card: {exc}") from None
    prefix = os.path.relpath(note_path.parent.resolve(), card_dir.resolve()).replace(os.sep, "/")
    prefix = "" if prefix == "." else prefix + "/"
    note_link = f"{prefix}{note_path.name}"
    card.text = _replace_section(card.text, serving_section(note, prefix, note_link))
    data = cast(ModelCardData, card.data)  # a ModelCard reads its metadata block as ModelCardData
    results = [r for r in data.eval_results or [] if not _is_ours(r)] + eval_results(note, served)
    data.eval_results = results or None
    if results and not data.model_name:
        data.model_name = note.title
    out = str(card)
    try:
        ModelCard(out, ignore_metadata_errors=False)
    except Exception as exc:  # noqa: BLE001 - never write a card the hub would refuse
        raise NoteError(f"the updated model card would not parse ({exc}); nothing was written") from None
    return out
