"""Next-token distributions of two manifests' models on the same positions (token agreement, mean KL).

The positions are the baseline's greedy continuation of each suite prompt, teacher-forced through both
models, so both distributions are conditioned on exactly the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servegate.contracts.manifest import ServedModel
from servegate.gates.base import GateContext
from servegate.gates.quality.statistics import NextTokenDivergence, next_token_divergence
from servegate.gates.suites.evaluation import ItemOutput, SuiteItem
from servegate.gates.suites.output_cache import weights_dir
from servegate.gates.time_split import TimeSplit

DIVERGENCE_ITEMS = 64
"""Suite items (the first ones) whose continuations are teacher-forced through both models."""


class DivergenceUnavailable(Exception):
    """The model behind a manifest cannot be loaded directly (e.g. an endpoint backend)."""


def load_lm(served: ServedModel) -> tuple[Any, Any]:
    """The manifest's causal LM (quantized as it declares) and its tokenizer, loaded in process."""
    if served.runtime.remote:
        raise DivergenceUnavailable("the endpoint backend exposes no full next-token distributions")
    try:
        from servegate.runtime.model.weights import load_causal_lm
    except ImportError:  # the runtime's loader is optional here: plain transformers does the same
        load_causal_lm = None  # type: ignore[assignment]  # None marks the loader as absent
    if load_causal_lm is not None:
        loaded: Any = load_causal_lm(served)  # a LoadedModel, or (model, tokenizer) from an older loader
        model, tokenizer = (loaded.model, loaded.tokenizer) if hasattr(loaded, "model") else loaded
    else:
        directory = weights_dir(served)
        if directory is None:
            raise DivergenceUnavailable(f"no local weights for {served.weights.source}")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if served.runtime.quantization.method != "none":
        try:
            from servegate.runtime.model.quantization import quantize_model
        except ImportError as exc:
            raise DivergenceUnavailable(f"servegate.runtime.model.quantization is not available: {exc}") from None
        quantize_model(model, served.runtime.quantization)  # in place; returns a report
    model.eval()
    return model, tokenizer


LOGITS_BUDGET_BYTES = 256 * 2**20
"""Most float32 logits one forward pass may hold ([rows, width, vocab]): a 49,152-token vocabulary over 200
positions is 39 MiB a row, so 64 rows at once would take 2.5 GiB per model."""


def prompt_ids(served: ServedModel, tokenizer: Any, items: Sequence[SuiteItem]) -> list[list[int]]:
    """Each item's prompt as the engine encodes it: a chat item's request through the manifest's chat template
    (its answer was generated after the rendered prompt), a text item's prompt as it is."""
    from servegate.runtime.preprocess import Preprocessor

    encoder = Preprocessor(served, tokenizer) if any(item.request is not None for item in items) else None
    return [
        list(tokenizer(item.prompt)["input_ids"]) if item.request is None or encoder is None
        else list(encoder.encode(item.request).token_ids)
        for item in items
    ]  # fmt: skip


def teacher_forced_logits(
    model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]
) -> Any:
    """Logits predicting each continuation token after its prompt: [sum of continuation lengths, vocab] (float32),
    in passes of at most LOGITS_BUDGET_BYTES."""
    import torch

    rows = [
        (list(prompt) + list(cont), len(prompt), len(cont)) for prompt, cont in zip(prompts, continuations, strict=True)
    ]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    vocab = int(getattr(model.config, "vocab_size", None) or len(tokenizer))
    widest = max((len(ids) for ids, _, _ in rows), default=1)
    batch = max(1, LOGITS_BUDGET_BYTES // (widest * vocab * 4))
    out = []
    with torch.inference_mode():
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            width = max(len(ids) for ids, _, _ in chunk)
            # Right padding: with a causal model, padding after a row never changes that row's logits.
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for r, (row, _, _) in enumerate(chunk):
                ids[r, : len(row)] = torch.tensor(row)
                mask[r, : len(row)] = 1
            logits = model(input_ids=ids, attention_mask=mask).logits  # [B, T, V]
            for r, (_, prompt_len, cont_len) in enumerate(chunk):
                # position t predicts token t+1: the continuation starts at prompt_len; a copy, so the pass's
                # whole [B, T, V] tensor is freed before the next
                out.append(logits[r, prompt_len - 1 : prompt_len - 1 + cont_len].float().clone())
            del logits
    if not out:
        return torch.zeros((0, 1))
    return torch.cat(out, dim=0)


class DivergenceProbe:
    """Loads both manifests' models once and measures their divergence on any number of suites."""

    def __init__(self, baseline: ServedModel, candidate: ServedModel, split: TimeSplit | None = None) -> None:
        self.baseline = baseline
        self.candidate = candidate
        self._models: dict[str, tuple[Any, Any]] = {}
        self._split = split or TimeSplit()
        """Where loading the two models is charged as "model loads" (the check's split, in a gate)."""

    def _lm(self, side: str) -> tuple[Any, Any]:
        if side not in self._models:
            with self._split.phase("model loads"):
                self._models[side] = load_lm(self.baseline if side == "baseline" else self.candidate)
        return self._models[side]

    def measure(self, items: Sequence[SuiteItem], baseline_outputs: Sequence[ItemOutput]) -> NextTokenDivergence:
        """Token agreement and mean KL along the baseline's greedy outputs of these items."""
        keep = [(i, o) for i, o in zip(items, baseline_outputs, strict=True) if o.error is None and o.token_ids]
        chosen = [i for i, _ in keep]
        continuations = [o.token_ids for _, o in keep]
        base_model, base_tok = self._lm("baseline")
        cand_model, cand_tok = self._lm("candidate")
        base_logits = teacher_forced_logits(
            base_model, base_tok, prompt_ids(self.baseline, base_tok, chosen), continuations
        )
        cand_logits = teacher_forced_logits(
            cand_model, cand_tok, prompt_ids(self.candidate, cand_tok, chosen), continuations
        )
        return next_token_divergence(base_logits, cand_logits)


def next_token_report(ctx: GateContext, candidate: ServedModel) -> dict[str, Any]:
    """Token agreement and KL per suite against the baseline; a reason when the models cannot be loaded."""
    out: dict[str, Any] = {}
    probe = DivergenceProbe(ctx.baseline, candidate, ctx.split)
    for data in ctx.suites():
        base_run = ctx.run_suite(ctx.baseline, data, role="baseline")
        try:
            # a sample is enough for a diagnostic; the verdict rests on the paired tests over every item
            with ctx.split.phase("divergence probe"):
                result = probe.measure(list(data.items[:DIVERGENCE_ITEMS]), base_run.outputs[:DIVERGENCE_ITEMS])
        except DivergenceUnavailable as exc:
            return {"unavailable": str(exc)}
        except Exception as exc:  # a measurement, not the verdict: record why it is missing
            return {"unavailable": f"{type(exc).__name__}: {exc}"}
        out[data.name] = {
            "items": min(len(data.items), DIVERGENCE_ITEMS),
            "positions": result.positions,
            "token_agreement": round(result.token_agreement, 6),
            "mean_kl_nats": round(result.mean_kl, 8),
            "max_kl_nats": round(result.max_kl, 8),
        }
    return out
