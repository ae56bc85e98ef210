"""Which of the batching gate's mismatches are numerical ties: float sums reassociated by the batch, not a fault.

A CPU (or GPU) BLAS picks its kernel by the shape of the product: one row (a lone decode) goes through a
matrix-vector kernel, several rows through a matrix-matrix one, and the two add the same products in different
orders. So a sequence's logits differ in their last bits with the size of its batch. On SmolLM2-135M in float32
on OpenBLAS the log-probabilities of 58 outputs that matched moved by at most 1.9e-5 nats (median 6.9e-6) between
the unbatched reference and one batch of 60 (2026-12-05, AMD EPYC); where the reference's two best tokens are
closer than that, the batch may pick the other one, and the answer goes on differently from there. That is
no batching fault (no request saw another's tokens, no cache slot was shared), and no engine that batches with a
vendor BLAS avoids it; a fault moves logits by far more than float rounding, at tokens the model is sure of.

So for each output that differs, the probe is run alone again on the unbatched reference with log-probabilities,
and the first token where the two answers part is looked at: when the reference ranks the token the batch chose
within TIE_MARGIN_NATS of its own choice, the mismatch is a numerical tie. The gate then warns with the figures
instead of failing; any other mismatch still fails it. Where the reference's ids are not the engine's own (a
remote's text re-tokenized) or the rerun does not reproduce the answer up to that token, nothing is excused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from servegate.contracts.manifest import ServedModel
from servegate.gates.base import GateContext
from servegate.gates.suites.evaluation import ItemOutput, generate
from servegate.runtime.types import FinishEvent, GenerationRequest

TIE_MARGIN_NATS = 1e-3
"""Largest gap (nats) between the reference's chosen token and the batch's that counts as a numerical tie: 50x the
largest float drift measured between batched and unbatched log-probabilities on SmolLM2-135M (1.9e-5; module
notes), far below what a request reading another's state moves (whole nats, at confident tokens)."""
TOP_ALTERNATIVES = 5
"""Alternatives asked of the reference at each position: the batch's token must be among them to be a tie."""


@dataclass(frozen=True)
class Divergence:
    """Where a batched output first parts from the unbatched reference, and how close the reference's call was."""

    item: str
    position: int
    """Index of the first differing output token."""
    margin_nats: float | None
    """The reference's log-probability of its own token minus that of the batch's token (None: not measured)."""

    @property
    def tie(self) -> bool:
        """Whether the reference itself could not tell the two tokens apart beyond float rounding."""
        return self.margin_nats is not None and self.margin_nats <= TIE_MARGIN_NATS


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token sequences differ (the shorter one's length when one is a prefix of the
    other; None when they are equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # lengths may differ: the rest is checked below
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _with_logprobs(served: ServedModel) -> ServedModel:
    """The manifest offering log-probabilities (asking for them changes no token a greedy answer picks)."""
    if served.postprocess.logprobs:
        return served
    return served.with_changes(postprocess={**served.postprocess.model_dump(mode="python"), "logprobs": True})


def judge_divergences(
    ctx: GateContext,
    reference: ServedModel,
    mismatched: Sequence[tuple[GenerationRequest, ItemOutput, ItemOutput]],
) -> list[Divergence]:
    """For each (request, unbatched output, batched output) that differ, in order: where they part (-1: not in
    their tokens) and the reference's margin there, measured by running the request alone on `reference` with
    log-probabilities (None where it cannot be judged: see _judgeable and _margin)."""
    parts = [first_difference(alone.token_ids, batched.token_ids) for _, alone, batched in mismatched]
    judged = [k for k, (_, a, b) in enumerate(mismatched) if _judgeable(reference, a, b, parts[k])]
    margins: dict[int, float | None] = {}
    if judged:
        from servegate.runtime.model.weights import load_tokenizer

        audited = _with_logprobs(reference)
        tokenizer = load_tokenizer(audited)
        engine = ctx.engines.get(audited, tag="batching-ties")
        asks = [mismatched[k][0] for k in judged]
        asks = [replace(r, params=replace(r.params, logprobs=True, top_logprobs=TOP_ALTERNATIVES)) for r in asks]
        for k, result in zip(judged, generate(engine, asks), strict=True):
            _, alone, batched = mismatched[k]
            at = parts[k]
            assert at is not None  # _judgeable
            margins[k] = _margin(result, alone, batched, at, tokenizer)
    return [
        Divergence(request.id, -1 if at is None else at, margins.get(k))
        for k, ((request, _, _), at) in enumerate(zip(mismatched, parts, strict=True))
    ]


def _judgeable(reference: ServedModel, alone: ItemOutput, batched: ItemOutput, at: int | None) -> bool:
    """Both answers carry the engine's own ids and part (at `at`, their first_difference) at a token both
    generated (not at an error or an end)."""
    if reference.runtime.remote or alone.error is not None or batched.error is not None:
        return False
    if alone.token_source != "engine" or batched.token_source != "engine":
        return False
    return at is not None and at < min(len(alone.token_ids), len(batched.token_ids))


def _margin(result: object, alone: ItemOutput, batched: ItemOutput, at: int, tokenizer: object) -> float | None:
    """The reference's log-probability gap at `at` between its token and the batch's, from the rerun; None when
    the rerun did not reproduce the reference up to there or the batch's token is not among its alternatives."""
    if not isinstance(result, FinishEvent) or result.logprobs is None or result.top_logprobs is None:
        return None
    if tuple(result.token_ids[: at + 1]) != tuple(alone.token_ids[: at + 1]) or at >= len(result.top_logprobs):
        return None
    other = tokenizer.decode([batched.token_ids[at]])  # type: ignore[attr-defined]  # a transformers tokenizer
    alternatives = result.top_logprobs[at]
    if other not in alternatives:
        return None
    return float(result.logprobs[at]) - float(alternatives[other])
