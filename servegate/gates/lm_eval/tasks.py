"""Suites that are lm-evaluation-harness tasks: load the task's documents, run it on an engine, keep per-sample scores.

lm-eval builds the prompts (few-shot included) and scores each sample with the task's metrics; servegate
runs every request on the manifest's engine (`ServegateLM`) and keeps lm-eval's logged per-sample metric
values by doc id, so baseline and candidate go through the same paired non-inferiority test as any suite.
lm-eval is imported only here and only for an lm-eval suite (it is an optional extra).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.quality_section import LM_EVAL_INSTALL, LmEvalTask, Suite, lm_eval_installed
from servegate.gates.suites.evaluation import ItemOutput, Progress, SuiteData, SuiteItem, load_suite_data, run_items
from servegate.runtime.engine.interface import Engine
from servegate.runtime.types import FinishEvent, PromptLogprobs

log = logging.getLogger("servegate.gates")


def load_any_suite(served: ServedModel, suite: Suite) -> SuiteData:
    """A declared suite's items: an lm-eval task's documents, or a JSONL suite's rows."""
    return load_lm_eval_data(served, suite) if suite.lm_eval is not None else load_suite_data(served, suite)


def run_any_items(
    engine: Engine, data: SuiteData, items: Sequence[SuiteItem] | None = None, progress: Progress | None = None
) -> list[ItemOutput]:
    """Outputs of (some of) a suite's items: its lm-eval task run on the engine, or greedy generations."""
    if data.suite.lm_eval is not None:
        return run_lm_eval_items(engine, data, items, progress)
    return run_items(engine, data, items, progress)


def _require_lm_eval(suite: Suite) -> None:
    if not lm_eval_installed():
        raise ServegateError(f"quality.suites[{suite.name}] is an lm-eval task: run {LM_EVAL_INSTALL}")


def include_dir(served: ServedModel, task: LmEvalTask) -> str | None:
    """The folder of task YAMLs: `zoo` (the zoo's own tasks), a path relative to the manifest, or none."""
    if task.include_path is None:
        return None
    if task.include_path == "zoo":
        from servegate.zoo.lm_eval_tasks import task_dir

        return str(task_dir())
    path = served.resolve_path(task.include_path)
    if not Path(path).is_dir():
        raise ServegateError(f"lm_eval.include_path: {path} is not a folder of task YAMLs")
    return str(path)


@functools.lru_cache(maxsize=16)
def task_manager(include: str | None, name: str) -> Any:
    """lm-eval's TaskManager that knows `name`: the include folder alone when it defines it (fast), else all."""
    from lm_eval.tasks import TaskManager

    if include is not None:
        local = TaskManager(include_path=include, include_defaults=False)
        if name in local.all_tasks:
            return local
    manager = TaskManager(include_path=include)
    if name not in manager.all_tasks:
        where = f" (nor under {include})" if include else ""
        raise ServegateError(f"lm-eval knows no task {name!r}{where}: check lm_eval.task or lm_eval.include_path")
    return manager


@functools.lru_cache(maxsize=16)
def load_task(include: str | None, name: str) -> Any:
    """The lm-eval Task object (its documents downloaded or read once per process)."""
    from lm_eval.tasks import get_task_dict

    tasks = get_task_dict([name], task_manager(include, name))
    task = tasks.get(name)
    if task is None or not hasattr(task, "eval_docs"):
        raise ServegateError(f"lm-eval task {name!r} is a group of tasks: name one task per suite")
    return task


def load_lm_eval_data(served: ServedModel, suite: Suite) -> SuiteData:
    """An lm-eval suite's documents as items (doc id, prompt, target) with a digest over them and the task config."""
    _require_lm_eval(suite)
    spec = suite.lm_eval
    assert spec is not None
    try:
        task = load_task(include_dir(served, spec), spec.task)
        docs = list(task.eval_docs)
    except ServegateError:
        raise
    except Exception as exc:  # a task whose data cannot be read here (no hub, a bad YAML): one line for the user
        raise ServegateError(f"quality.suites[{suite.name}]: lm-eval task {spec.task!r} cannot load: {exc}") from exc
    limit = suite.item_limit
    items = [_item(task, doc_id, doc) for doc_id, doc in enumerate(docs[:limit] if limit is not None else docs)]
    metrics = list(task.aggregation())
    if "metrics" in suite.model_fields_set:
        unknown = [m for m in suite.metrics if m not in metrics]
        if unknown:
            raise ServegateError(
                f"quality.suites[{suite.name}]: task {spec.task} reports {', '.join(metrics)}, not {', '.join(unknown)}"
            )
    else:
        suite = suite.model_copy(update={"metrics": metrics})
    digest = hashlib.sha256()
    digest.update(json.dumps(suite.model_dump(mode="json"), sort_keys=True).encode())
    digest.update(json.dumps(task.dump_config(), sort_keys=True, default=str).encode())
    for item in items:
        digest.update(json.dumps([item.id, item.prompt, item.reference]).encode())
    return SuiteData(suite, tuple(items), digest.hexdigest(), None)


def _item(task: Any, doc_id: int, doc: Any) -> SuiteItem:
    """One document as an item: id is the doc id (lm-eval's key for logged samples)."""
    target = task.doc_to_target(doc)
    if task.OUTPUT_TYPE == "multiple_choice" and isinstance(target, int):
        target = task.doc_to_choice(doc)[target]
    return SuiteItem(str(doc_id), str(task.doc_to_text(doc)), str(target))


def run_lm_eval_items(
    engine: Engine, data: SuiteData, items: Sequence[SuiteItem] | None = None, progress: Progress | None = None
) -> list[ItemOutput]:
    """Run the task on `engine` (all items, or the chosen doc ids); one output per item with lm-eval's scores."""
    outputs, _ = run_lm_eval(engine, data, items)
    if progress is not None:
        progress(len(outputs))
    return outputs


def run_lm_eval(
    engine: Engine, data: SuiteData, items: Sequence[SuiteItem] | None = None
) -> tuple[list[ItemOutput], dict[str, Any]]:
    """Outputs per item (lm-eval's per-sample metrics in `scores`) and lm-eval's own results for the task."""
    from lm_eval import simple_evaluate

    from servegate.gates.lm_eval.model import ServegateLM

    _require_lm_eval(data.suite)
    spec = data.suite.lm_eval
    assert spec is not None
    chosen = list(data.items if items is None else items)
    served = engine.served
    include = include_dir(served, spec)
    lm = ServegateLM(engine=engine)
    whole = items is None
    logging.getLogger("lm-eval").setLevel(logging.WARNING)
    results = simple_evaluate(
        model=lm,
        tasks=[spec.task],
        task_manager=task_manager(include, spec.task),
        num_fewshot=spec.num_fewshot,
        limit=data.suite.item_limit if whole else None,
        # sorted: lm-eval runs the chosen documents in dataset order but labels them in the order given
        samples=None if whole else {spec.task: sorted({int(i.id) for i in chosen})},
        log_samples=True,
        bootstrap_iters=0,
        random_seed=served.runtime.seed,
        numpy_random_seed=served.runtime.seed,
        torch_random_seed=served.runtime.seed,
        fewshot_random_seed=spec.fewshot_seed,
    )
    if results is None:
        raise ServegateError(f"lm-eval returned no results for task {spec.task}")
    samples = {int(s["doc_id"]): s for s in results["samples"].get(spec.task, [])}
    outputs = [
        _output(item, sample, lm.results_for(spec.task, sample.get("arguments", [])) if sample else [])
        for item, sample in ((item, samples.get(int(item.id))) for item in chosen)
    ]
    return outputs, dict(results["results"].get(spec.task, {}))


def _output(item: SuiteItem, sample: dict[str, Any] | None, results: list[tuple[int, Any]]) -> ItemOutput:
    """One item's record: the engine's text (or the chosen option), its first error, and lm-eval's scores."""
    from servegate.gates.lm_eval.model import error_code

    if sample is None:
        return ItemOutput(item.id, None, error="lost")
    scores = {m: float(sample[m]) for m in sample.get("metrics", []) if m in sample}
    error = error_code(results)
    ordered = [r for _, r in sorted(results, key=lambda r: r[0])]
    scored = [r for r in ordered if isinstance(r, PromptLogprobs)]
    finished = [r for r in ordered if isinstance(r, FinishEvent)]
    if finished:
        base = ItemOutput.from_result(item.id, finished[0])
        return ItemOutput(**{**base.__dict__, "error": error, "scores": scores})
    text = _chosen_option(sample)
    return ItemOutput(
        item.id,
        text if error is None else None,
        error=error,
        prompt_tokens=max((len(r.token_ids) for r in scored), default=0),
        truncated_tokens=max((r.truncated_tokens for r in scored), default=0),
        scores=scores,
    )


def _chosen_option(sample: dict[str, Any]) -> str | None:
    """The continuation with the highest log-likelihood among a multiple-choice sample's options."""
    options = [args[1] for args in sample.get("arguments", []) if isinstance(args, (list, tuple)) and len(args) == 2]
    values = [r[0] if isinstance(r, (list, tuple)) else r for r in sample.get("filtered_resps", [])]
    if not options or len(options) != len(values):
        return None
    best = max(range(len(values)), key=lambda i: float(values[i]))
    return str(options[best])


def lm_eval_aggregate(served: ServedModel, data: SuiteData, scores: dict[str, list[float]]) -> dict[str, float]:
    """lm-eval's own aggregate of each metric: the task's aggregation functions over the per-sample values."""
    spec = data.suite.lm_eval
    if spec is None or not lm_eval_installed():
        return {}
    functions = load_task(include_dir(served, spec), spec.task).aggregation()
    return {m: round(float(functions[m](values)), 6) for m, values in scores.items() if m in functions and values}
