"""`servegate` as an lm-evaluation-harness model: lm-eval's requests run on a servegate engine in process.

The engine is the manifest's own (`servegate.runtime.build`): the reference engine with no HTTP, or the
endpoint engine through the contract layer, so quantization, truncation, batching, stop strings and the
response cache apply exactly as for servegate's JSONL suites. `generate_until` becomes greedy generation
requests; `loglikelihood` scores prompt + continuation in one prefill (`Engine.score`) and sums the
continuation's token log-probabilities. Each request's result is kept by (task, doc id), so a suite run
can report what the engine did per sample. Needs `pip install 'servegate[lm-eval]'`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval fills its registry lazily only while it is empty: fill it first)
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from servegate.contracts.errors import ServegateError
from servegate.runtime.engine.interface import Engine
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest, PromptLogprobs, SamplingParams

DEFAULT_MAX_GEN_TOKS = 256
"""lm-eval's own default output length when a task's generation_kwargs set none."""


def request_key(instance: Any) -> tuple[str, int]:
    """(task name, doc id) of an lm-eval request instance."""
    return str(instance.task_name), int(instance.doc_id)


@register_model("servegate")
class ServegateLM(LM):
    """lm-eval's `LM` over a servegate engine (`--model servegate --model_args manifest=PATH`, or `engine=`)."""

    def __init__(
        self,
        engine: Engine | None = None,
        manifest: str | None = None,
        chunk: int = 64,
        progress: Callable[[int], None] | None = None,
        **lm_eval_options: Any,
    ) -> None:
        """`engine`: a built servegate engine; else `manifest` is loaded and its engine built (and owned).

        lm-eval's own options (batch_size, device, ...) are ignored: the manifest's batching and device apply.
        """
        super().__init__()
        self._owned = engine is None
        if engine is None:
            if manifest is None:
                raise ServegateError("the servegate lm-eval model needs model_args manifest=PATH")
            from servegate.contracts.loading import load_manifest
            from servegate.runtime import build

            engine = build(load_manifest(manifest))
        self.engine = engine
        self.chunk = max(1, int(chunk))
        self.progress = progress
        self.results: dict[tuple[str, int], list[tuple[int, Any]]] = {}
        """(task, doc id) -> (request index, what the engine returned) for every request of that doc."""
        self._by_request: dict[tuple[str, str], Any] = {}
        """(task, repr of the request's arguments) -> what the engine returned (how a logged sample finds it:
        lm-eval renumbers the instances' doc ids when it runs chosen documents)."""

    def close(self) -> None:
        """Shut down the engine when this model built it."""
        if not self._owned:
            return
        self.engine.shutdown_sync()

    # --- pieces -----------------------------------------------------------------------------------

    def _tokenizer(self) -> Any:
        """The manifest's tokenizer, as the engine holds it."""
        self.engine.start_sync()
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            why = self.engine.why_no_tokenizer
            raise ServegateError(f"this engine has no tokenizer to encode lm-eval's requests with ({why})")
        return tokenizer

    def _record(self, instance: Any, result: Any) -> None:
        self.results.setdefault(request_key(instance), []).append((int(instance.idx), result))
        self._by_request[(str(instance.task_name), repr(tuple(instance.args)))] = result

    def results_for(self, task: str, arguments: Sequence[Any]) -> list[tuple[int, Any]]:
        """(index, what the engine returned) for each request of a logged sample, found by its arguments."""
        found = ((i, self._by_request.get((task, repr(tuple(args))))) for i, args in enumerate(arguments))
        return [(i, result) for i, result in found if result is not None]

    def _pair_ids(self, context: str, continuation: str) -> tuple[list[int], int]:
        """Token ids of context + continuation (BOS as the tokenizer adds it) and how many are the continuation."""
        tokenizer = self._tokenizer()
        spaces = len(context) - len(context.rstrip())
        if spaces:  # a trailing space belongs to the continuation's first token, as lm-eval's HF model does
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        context_ids = list(tokenizer(context)["input_ids"]) if context else self._bos(tokenizer)
        whole = (
            list(tokenizer(context + continuation)["input_ids"])
            if context
            else context_ids + self._plain(tokenizer, continuation)
        )
        if whole[: len(context_ids)] != context_ids or len(whole) == len(context_ids):
            whole = context_ids + self._plain(tokenizer, continuation)  # the pair does not split at the boundary
        return whole, len(whole) - len(context_ids)

    @staticmethod
    def _plain(tokenizer: Any, text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    @staticmethod
    def _bos(tokenizer: Any) -> list[int]:
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is None:
            bos = getattr(tokenizer, "eos_token_id", None)
        if bos is None:
            raise ServegateError("an empty lm-eval context needs a BOS or EOS token to start from")
        return [int(bos)]

    def _score(self, requests: list[GenerationRequest]) -> list[Any]:
        if not self.engine.scores_prompts:
            raise ServegateError(f"{type(self.engine).__name__} cannot score prompts (loglikelihood tasks)")
        out: list[Any] = []
        for start in range(0, len(requests), self.chunk):
            out.extend(self.engine.score(requests[start : start + self.chunk]))
        return out

    # --- lm-eval's interface ----------------------------------------------------------------------

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        """(sum of the continuation's token log-probabilities, whether every one was greedy) per request."""
        pairs = [self._pair_ids(*instance.args) for instance in requests]
        asks = [GenerationRequest(id=f"ll/{i}", prompt_token_ids=ids) for i, (ids, _) in enumerate(pairs)]
        answers: list[tuple[float, bool]] = []
        for instance, (_, n_cont), result in zip(requests, pairs, self._score(asks), strict=True):
            self._record(instance, result)
            answers.append(self._continuation_score(result, n_cont))
        if self.progress is not None:
            self.progress(0)
        return answers

    def _continuation_score(self, result: Any, n_cont: int) -> tuple[float, bool]:
        """The continuation's log-likelihood from a scored prompt (-inf when truncation cut it or it failed)."""
        if not isinstance(result, PromptLogprobs) or n_cont >= len(result.token_ids):
            return -math.inf, False
        if result.truncated_tokens and self.engine.served.preprocess.truncation == "right":
            return -math.inf, False  # the kept tokens end before the continuation does
        values = result.logprobs[-n_cont:]
        return float(sum(v for v in values if v is not None)), all(result.greedy[-n_cont:])

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        """Log-likelihood of each whole text (one window: the manifest's input limit and truncation apply)."""
        pairs = [self._pair_ids("", instance.args[0]) for instance in requests]
        asks = [GenerationRequest(id=f"roll/{i}", prompt_token_ids=ids) for i, (ids, _) in enumerate(pairs)]
        answers: list[float] = []
        for instance, (_, n_cont), result in zip(requests, pairs, self._score(asks), strict=True):
            self._record(instance, result)
            answers.append(self._continuation_score(result, n_cont)[0])
        return answers

    def generate_until(self, requests: list[Any]) -> list[str]:
        """Greedy text per request, stopped at the task's `until` strings (and the manifest's stops)."""
        asks = []
        for i, instance in enumerate(requests):
            context, kwargs = instance.args
            until = kwargs.get("until") or ()
            stops = (until,) if isinstance(until, str) else tuple(until)
            max_tokens = int(kwargs.get("max_gen_toks") or DEFAULT_MAX_GEN_TOKS)
            asks.append(
                GenerationRequest(
                    id=f"gen/{i}", prompt=context, params=SamplingParams(max_tokens=max_tokens, stop=stops)
                )
            )
        texts: list[str] = []
        for start in range(0, len(asks), self.chunk):
            part = asks[start : start + self.chunk]
            results = self.engine.generate(part)
            for instance, result in zip(requests[start : start + len(part)], results, strict=True):
                self._record(instance, result)
                texts.append(result.text if isinstance(result, FinishEvent) else "")
            if self.progress is not None:
                self.progress(0)
        return texts


def error_code(results: Sequence[tuple[int, Any]]) -> str | None:
    """The first catalogued error among one doc's requests (None when all succeeded)."""
    for _, result in sorted(results, key=lambda r: r[0]):
        if isinstance(result, ErrorEvent):
            return result.error.code
    return None
