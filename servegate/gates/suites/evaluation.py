"""Run a manifest's eval suites on an engine and score every item with the zoo's metric modules."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.quality_section import Suite
from servegate.gates.suites.chat_items import called, item_request, item_schema
from servegate.runtime.engine.interface import Engine
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest, SamplingParams

Progress = Callable[[int], None]
"""Called with the number of items just finished."""


@dataclass(frozen=True)
class SuiteItem:
    """One eval item: its id, prompt and expected output."""

    id: str
    prompt: str
    reference: str
    request: GenerationRequest | None = None
    """A chat, extraction or tools item's chat request, built by the request translator under the manifest that
    loaded the suite (None: a text item, whose prompt is completed as it is)."""


@dataclass(frozen=True)
class SuiteData:
    """A declared suite with its loaded items and content hash."""

    suite: Suite
    items: tuple[SuiteItem, ...]
    digest: str
    """sha256 over the suite declaration and every item (the cache key's suite part)."""
    schema: dict[str, Any] | None = None
    """JSON Schema used by schema-validity metrics (the manifest's output_schema, or the suite's own)."""

    @property
    def name(self) -> str:
        """The suite's name in reports."""
        return self.suite.name


@dataclass(frozen=True)
class ItemOutput:
    """What the engine returned for one item: the text, or the catalogued error code."""

    id: str
    text: str | None
    token_ids: tuple[int, ...] = ()
    error: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    truncated_tokens: int = 0
    fallback_used: bool = False
    cached: bool = False
    output_valid: bool | None = None
    scores: dict[str, float] | None = None
    """Per-sample metric values lm-eval logged for this item (lm-eval suites only; others are scored here)."""
    token_source: str = "engine"
    """Where token_ids come from (runtime.types.TokenSource): the engine's ids, a remote's, its logprobs'
    token names, or its text re-tokenized."""

    @classmethod
    def from_result(cls, item_id: str, result: FinishEvent | ErrorEvent) -> ItemOutput:
        """Convert an engine result into a plain record."""
        if isinstance(result, ErrorEvent):
            return cls(item_id, None, error=result.error.code)
        return cls(
            item_id,
            result.text,
            tuple(int(t) for t in result.token_ids),
            None,
            result.finish_reason,
            result.usage.prompt_tokens,
            result.usage.truncated_tokens,
            result.fallback_used,
            result.cached,
            result.output_valid,
            token_source=result.token_source,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ItemOutput:
        """Rebuild from the cached JSON form."""
        return cls(**{**data, "token_ids": tuple(data.get("token_ids", ()))})


def same_output(a: ItemOutput, b: ItemOutput) -> bool:
    """Whether two outputs are the same answer: the same error, else the same text and, where both sides' ids
    are the model's own (not the text re-tokenized, which has no EOS), the same tokens."""
    if a.error != b.error:
        return False
    if a.error is not None:
        return True
    if a.text != b.text:
        return False
    if "tokenizer" in (a.token_source, b.token_source):
        return True  # ids read from the text say nothing the text does not
    return a.token_ids == b.token_ids


def token_sources(outputs: Sequence[ItemOutput]) -> str:
    """The token sources of the answered outputs, in first-seen order, joined by ', ' (`none` when none answered)."""
    seen = dict.fromkeys(o.token_source for o in outputs if o.error is None)
    return ", ".join(seen) or "none"


@dataclass
class SuiteRun:
    """One suite evaluated on one manifest: outputs and per-item scores, in item order."""

    data: SuiteData
    outputs: list[ItemOutput]
    scores: dict[str, list[float]] = field(default_factory=dict)
    """metric -> one score per item (errors score 0)."""
    from_cache: bool = False

    def score(self, metric: str) -> float:
        """The suite-level score of `metric` (mean over items)."""
        values = self.scores[metric]
        return sum(values) / len(values) if values else 0.0

    def summary(self) -> dict[str, Any]:
        """Suite-level numbers for reports."""
        return {
            "items": len(self.outputs),
            "errors": sum(o.error is not None for o in self.outputs),
            **{metric: round(self.score(metric), 6) for metric in self.scores},
        }


# --- loading suites -------------------------------------------------------------------------------


def _suite_source(served: ServedModel, suite: Suite) -> str:
    if suite.dataset.startswith(("zoo:", "hf:")):
        return suite.dataset
    return str(served.resolve_path(suite.dataset))


def _schema_for(served: ServedModel, suite: Suite, source: str) -> dict[str, Any] | None:
    """The schema a validity metric checks: the manifest's output_schema, else one shipped with the suite."""
    if served.postprocess.output_schema is not None:
        return dict(served.postprocess.output_schema)
    if source == "zoo:json":
        from servegate.zoo.eval_suites import json_output_schema

        return json_output_schema()
    beside = Path(source).with_suffix(".schema.json")
    if not source.startswith(("zoo:", "hf:")) and beside.is_file():
        loaded: dict[str, Any] = json.loads(beside.read_text(encoding="utf-8"))
        return loaded
    return None


@functools.lru_cache(maxsize=64)
def _rows(source: str, split: str, limit: int | None, stamp: int) -> tuple[dict[str, Any], ...]:
    """Suite rows, loaded once per process (`stamp` is a local file's mtime, so an edit reloads it)."""
    from servegate.zoo.eval_suites import load_suite

    return tuple(load_suite(source, split, limit))


def load_suite_data(served: ServedModel, suite: Suite) -> SuiteData:
    """Load a declared JSONL suite's items (its `limit` applied) and hash them (lm-eval suites: lm_eval/tasks.py)."""

    source = _suite_source(served, suite)
    try:
        stamp = Path(source).stat().st_mtime_ns if Path(source).is_file() else 0
        rows = _rows(source, suite.split, suite.limit, stamp)
    except Exception as exc:  # zoo errors, missing files, unreadable data: one line for the user
        raise ServegateError(f"quality.suites[{suite.name}]: cannot load {suite.dataset!r}: {exc}") from exc
    schema = _schema_for(served, suite, source)
    items: list[SuiteItem] = []
    for row in rows:
        if suite.prompt_field not in row or suite.reference_field not in row:
            raise ServegateError(
                f"quality.suites[{suite.name}]: items need the fields {suite.prompt_field!r} and "
                f"{suite.reference_field!r} (found {', '.join(map(str, row))})"
            )
        item_id, prompt, reference = (
            str(row.get("id", len(items))),
            str(row[suite.prompt_field]),
            row[suite.reference_field],
        )
        if not isinstance(reference, str):  # an object reference (extraction, tools, a format rule)
            reference = json.dumps(reference, ensure_ascii=False)
        request = None if suite.kind == "text" else item_request(served, suite, row, item_id, prompt, schema)
        items.append(SuiteItem(item_id, prompt, reference, request))
    return make_suite_data(suite, items, schema)


def make_suite_data(suite: Suite, items: Sequence[SuiteItem], schema: dict[str, Any] | None = None) -> SuiteData:
    """Wrap already-loaded items (tests, plugins) with their content hash."""
    digest = hashlib.sha256()
    digest.update(json.dumps(suite.model_dump(mode="json"), sort_keys=True).encode())
    digest.update(json.dumps(schema, sort_keys=True).encode())
    for item in items:
        digest.update(json.dumps([item.id, item.prompt, item.reference]).encode())
        if item.request is not None:  # what the chat request carries beyond the prompt: its schema or tools
            sent = item.request
            digest.update(repr((sent.messages, sent.tools, sent.params.constraint, sent.params.tool_use)).encode())
    return SuiteData(suite, tuple(items), digest.hexdigest(), schema)


# --- running and scoring --------------------------------------------------------------------------


def probe_items(suites: Sequence[SuiteData], per_suite: int) -> list[tuple[SuiteData, SuiteItem]]:
    """The first `per_suite` items of every suite: the probes the batching and caching gates send."""
    return [(data, item) for data in suites for item in data.items[:per_suite]]


def requests_for(data: SuiteData, items: Sequence[SuiteItem] | None = None, **request: Any) -> list[GenerationRequest]:
    """Greedy generation requests for a suite's items (ids are `suite/item`): a text item's prompt, an extraction
    or tools item's chat request."""
    chosen = data.items if items is None else items
    params = SamplingParams(max_tokens=data.suite.max_tokens, temperature=0.0)
    return [
        GenerationRequest(id=f"{data.name}/{item.id}", prompt=item.prompt, params=params, **request)
        if item.request is None
        else replace(item.request, id=f"{data.name}/{item.id}", **request)
        for item in chosen
    ]


def generate(
    engine: Engine, requests: Sequence[GenerationRequest], progress: Progress | None = None, chunk: int = 64
) -> list[FinishEvent | ErrorEvent]:
    """Run requests through `engine.generate` in chunks (so progress can move); results in input order."""
    results: list[FinishEvent | ErrorEvent] = []
    for start in range(0, len(requests), chunk):
        part = list(requests[start : start + chunk])
        out = engine.generate(part)
        if len(out) != len(part):
            raise ServegateError(f"the engine returned {len(out)} results for {len(part)} requests: requests were lost")
        results.extend(out)
        if progress is not None:
            progress(len(part))
    return results


@dataclass(frozen=True)
class Delivered:
    """How one request of a burst ended, and whether any tokens reached the client before that."""

    result: FinishEvent | ErrorEvent
    streamed: bool


def burst(engine: Engine, requests: Sequence[GenerationRequest], timeout_s: float = 120.0) -> list[Delivered | None]:
    """Submit every request at once (no feed window), so a bounded queue can overflow.

    One entry per request, in order; None for a request that never ended (lost).
    """
    import threading

    delivered: list[Delivered | None] = [None] * len(requests)
    streamed = [False] * len(requests)
    done = threading.Semaphore(0)

    def sink_for(i: int) -> Callable[[Any], None]:
        def sink(event: Any) -> None:
            if isinstance(event, (FinishEvent, ErrorEvent)):
                delivered[i] = Delivered(event, streamed[i])
                done.release()
            else:
                streamed[i] = True

        return sink

    for i, request in enumerate(requests):
        engine.enqueue(request, sink_for(i))
    for _ in requests:
        if not done.acquire(timeout=timeout_s):
            break
    return delivered


def run_items(
    engine: Engine, data: SuiteData, items: Sequence[SuiteItem] | None = None, progress: Progress | None = None
) -> list[ItemOutput]:
    """Generate greedy outputs for (some of) a JSONL suite's items (lm-eval suites: lm_eval/tasks.py)."""
    chosen = list(data.items if items is None else items)
    results = generate(engine, requests_for(data, chosen), progress)
    return [ItemOutput.from_result(item.id, result) for item, result in zip(chosen, results, strict=True)]


_METRICS: dict[str, Any] = {}


def _metric(name: str) -> Any:
    if name not in _METRICS:
        from servegate.zoo.evaluate_modules import load_metric

        try:
            _METRICS[name] = load_metric(name)
        except Exception as exc:
            raise ServegateError(f"metric {name!r} cannot be loaded: {exc}") from exc
    return _METRICS[name]


def score_items(
    metric: str,
    data: SuiteData,
    items: Sequence[SuiteItem],
    outputs: Sequence[ItemOutput],
    parser: str | None = None,
) -> list[float]:
    """Per-item scores of a zoo metric (an error or missing text scores 0). A tools item's answer is scored by the
    calls `parser` reads from it (None: the parser its request was built with); an extraction item's validity
    by its own schema."""
    module = _metric(metric)
    if metric == "json_schema_valid" and data.schema is None and not all(item_schema(i.request) for i in items):
        raise ServegateError(
            f"suite {data.name}: json_schema_valid needs a schema: declare postprocess.output_schema "
            "or ship <suite>.schema.json beside the suite file"
        )
    scores = []
    for item, output in zip(items, outputs, strict=True):
        if output.text is None:
            scores.append(0.0)
            continue
        prediction = output.text
        if data.suite.kind == "tools" and item.request is not None:
            prediction = called(item.request, output.text, parser)
        # The module's own scoring on a one-item list: evaluate's compute() spends ~20 ms per call
        # writing an Arrow cache, which would dominate a 600-item gate run.
        if metric == "json_schema_valid":
            given: dict[str, Any] = {"schema": item_schema(item.request) or data.schema}
        else:
            given = {"references": [item.reference]}
        value = module._compute(predictions=[prediction], **given)[metric]
        scores.append(float(value))
    return scores


def score_run(
    data: SuiteData, outputs: Sequence[ItemOutput], items: Sequence[SuiteItem] | None = None, parser: str | None = None
) -> dict[str, list[float]]:
    """Per-item scores of every metric the suite declares (an lm-eval suite: the values lm-eval logged); a tools
    suite's calls read by `parser` (the side's postprocess.tools.parser; None: the items' own)."""
    if data.suite.lm_eval is not None:
        return {m: [(o.scores or {}).get(m, 0.0) for o in outputs] for m in data.suite.metrics}
    chosen = data.items if items is None else items
    return {metric: score_items(metric, data, chosen, outputs, parser) for metric in data.suite.metrics}
