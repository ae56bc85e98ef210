"""Prompt-token log-probabilities on the reference engine's own model: one prefill, nothing sampled.

What log-likelihood evaluation needs (lm-eval's multiple-choice tasks, `echo` with `logprobs` over HTTP):
log p(token_i | tokens_<i) of every prompt token. The prompt goes through the manifest's preprocessor
first (chat template, input limit, truncation policy), and the model is the engine's own: the manifest's
weights, quantized as declared. The pass runs on the whole sequence at once under inference mode, outside
the paged KV pool (no request owns blocks for it), so it neither reads nor fills the prefix cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from servegate.contracts.errors import ServingError
from servegate.contracts.field_checks import check_token_ids
from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.loop_jobs import LoopJobs, result_of
from servegate.runtime.engine.parts import EngineParts
from servegate.runtime.types import ErrorEvent, GenerationRequest, PromptLogprobs, ScoreResult


def token_logprobs(model: Any, token_ids: Sequence[int], top_k: int = 1) -> PromptLogprobs:
    """log p of each token given the ones before it, whether it was the argmax there, the top_k tokens and the
    token's vocabulary rank at each position (first position: None, True, {}, None); request_id left empty."""
    import torch  # imported here: the engine module imports this one, and the CLI must start fast

    device = next(model.parameters()).device
    ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    targets = ids[0, 1:]
    chosen = logp.gather(1, targets[:, None])[:, 0]
    greedy = logp.argmax(dim=-1) == targets
    values, top_ids = logp.topk(max(1, top_k), dim=-1)
    top = [dict(zip(i, v, strict=True)) for i, v in zip(top_ids.tolist(), values.tolist(), strict=True)]
    ranks = (logp > chosen[:, None]).sum(dim=-1) + 1  # as vLLM ranks: 1 + the tokens strictly likelier
    return PromptLogprobs(
        "", tuple(token_ids), (None, *chosen.tolist()), (True, *greedy.tolist()), top=({}, *top),
        ranks=(None, *ranks.tolist()),
    )  # fmt: skip


def score_on_engine(
    served: ServedModel, parts: EngineParts, jobs: LoopJobs | None, requests: Sequence[GenerationRequest]
) -> list[ScoreResult]:
    """The reference engine's `score`: queued on its loop thread (`jobs`), or here when it runs no loop (embed)."""
    if jobs is None:  # task: embed; score_requests answers that there is no causal model
        return score_requests(served, parts, requests)
    return list(result_of(*jobs.put(lambda: score_requests(served, parts, requests))))


def score_requests(served: ServedModel, parts: EngineParts, requests: Sequence[GenerationRequest]) -> list[ScoreResult]:
    """Score each request's prompt as the manifest encodes it; a request the contract refuses gets its error."""
    model = parts.model
    if model is None:
        error = ServingError("invalid_request", detail="this engine has no causal model to score prompts with")
        return [ErrorEvent(r.id, error) for r in requests]
    preprocessor = parts.preprocessor
    assert preprocessor is not None  # a causal model comes with its preprocessor (None only for task: embed)
    results: list[ScoreResult] = []
    for request in requests:
        try:
            if not request.from_api:  # a request built in code (lm-eval's, a probe's): ids checked as at admission
                check_token_ids(preprocessor.vocab_size, {"prompt": request.prompt_token_ids or []})
            encoded = preprocessor.encode(request)
            ids = list(encoded.token_ids)
            if not ids:
                raise ServingError("invalid_request", param="prompt", detail="the prompt is empty")
            if len(ids) > served.runtime.max_model_len:
                raise ServingError("input_too_long", tokens=len(ids), limit=served.runtime.max_model_len)
        except ServingError as error:
            results.append(ErrorEvent(request.id, error))
            continue
        scored = token_logprobs(model, ids, request.params.top_logprobs)
        results.append(replace(scored, request_id=request.id, truncated_tokens=encoded.truncated_tokens))
    return results
