"""The zoo's lm-eval tasks run on real servegate engines: per-sample scores, lm-eval's own logs, paired verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lm_eval")

from test_lm_eval_suites import write_manifests  # noqa: E402

from servegate.contracts.loading import load_manifest  # noqa: E402
from servegate.gates.base import CheckResources, GateContext  # noqa: E402
from servegate.gates.quality.comparison import compare_on_suites  # noqa: E402
from servegate.gates.suites.output_cache import OutputCache  # noqa: E402

LIMIT = 80
"""Items per task: the smallest n at which an exact non-inferiority test can pass at a 5-point margin is 72."""


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_manifests(tmp_path_factory.mktemp("lm-eval"), LIMIT)


@pytest.fixture(scope="module")
def base_runs(manifests: dict[str, Path]) -> Any:
    """The base manifest's suites, and their runs on its reference engine (the engine stays up)."""
    served = load_manifest(manifests["base"])
    ctx = GateContext(served, served, resources=CheckResources(cache=OutputCache(enabled=False)))
    runs = {data.name: ctx.run_suite(served, data, role="candidate") for data in ctx.suites()}
    yield served, ctx, runs
    ctx.engines.close()


def test_per_sample_scores_equal_lm_eval_logged_samples(base_runs: Any) -> None:
    from lm_eval import simple_evaluate

    from servegate.gates.lm_eval.model import ServegateLM
    from servegate.gates.lm_eval.tasks import include_dir, task_manager

    served, ctx, runs = base_runs
    engine = ctx.engines.get(served)
    for data in ctx.suites():
        spec = data.suite.lm_eval
        logged = simple_evaluate(
            model=ServegateLM(engine=engine),
            tasks=[spec.task],
            task_manager=task_manager(include_dir(served, spec), spec.task),
            limit=LIMIT,
            log_samples=True,
            bootstrap_iters=0,
        )
        samples = {s["doc_id"]: s for s in logged["samples"][spec.task]}
        run = runs[data.name]
        assert len(samples) == len(run.outputs) == LIMIT
        for metric in data.suite.metrics:
            assert run.scores[metric] == [float(samples[i][metric]) for i in range(LIMIT)], (data.name, metric)
            assert abs(run.score(metric) - logged["results"][spec.task][f"{metric},none"]) < 1e-9


def test_the_scores_are_what_the_engine_answered(base_runs: Any) -> None:
    _, _, runs = base_runs
    arith, choice = runs["arith-lm"], runs["choice-lm"]
    assert arith.data.suite.metrics == ["exact_match"] and choice.data.suite.metrics == ["acc"]
    for item, output, score in zip(arith.data.items, arith.outputs, arith.scores["exact_match"], strict=True):
        assert score == float(output.text == item.reference)  # the generated text itself, stopped at "\n"
    for item, output, score in zip(choice.data.items, choice.outputs, choice.scores["acc"], strict=True):
        assert score == float(output.text == item.reference)  # the option with the highest log-likelihood
    assert 0.5 < arith.score("exact_match") <= 1.0 and 0.5 < choice.score("acc") <= 1.0


@pytest.mark.parametrize(("candidate", "verdict"), [("int8", "pass"), ("int2", "fail")])
def test_the_paired_verdict_on_a_quantized_candidate(
    manifests: dict[str, Path], base_runs: Any, candidate: str, verdict: str
) -> None:
    served, base_ctx, _ = base_runs
    cand = load_manifest(manifests[candidate])
    ctx = GateContext(served, cand, resources=CheckResources(cache=OutputCache(enabled=False)))
    # the baseline's runs are the module's: the same manifest, the same items
    ctx.resources.runs.update(base_ctx.resources.runs)
    try:
        out = compare_on_suites(ctx, served, cand)
    finally:
        ctx.engines.close()
    assert out.verdict == verdict, out.reason()
    assert {suite for suite, _ in out.tests} == {"arith-lm", "choice-lm"}
    aggregate = out.suites["choice-lm"]["lm_eval_aggregate"]
    assert set(aggregate) == {"baseline", "candidate"} and "acc" in aggregate["candidate"]
    if verdict == "fail":
        assert out.evidence and out.evidence[0]["suite"] in ("arith-lm", "choice-lm")


def run_gate(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """The real console entry point in a subprocess (its own cache folder)."""
    env = {**os.environ, "SERVEGATE_CACHE": str(cache), "HF_DATASETS_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "servegate.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_gate_eval_and_gate_check_run_lm_eval_suites(tmp_path: Path) -> None:
    paths = write_manifests(tmp_path, 20)
    out = tmp_path / "eval.json"
    done = run_gate("eval", str(paths["base"]), "--suite", "choice-lm", "--json", str(out), cache=tmp_path / "c")
    assert done.returncode == 0, done.stderr[-2000:]
    suites = json.loads(out.read_text())["suites"]
    assert list(suites) == ["choice-lm"] and suites["choice-lm"]["items"] == 20
    assert suites["choice-lm"]["lm_eval_aggregate"]["acc"] == suites["choice-lm"]["metrics"]["acc"]["score"]
    report = tmp_path / "check.json"
    args = ("check", "--baseline", str(paths["base"]), "--candidate", str(paths["int2"]), "--json", str(report))
    done = run_gate(*args, cache=tmp_path / "c")
    assert done.returncode == 1, done.stderr[-2000:]
    gate = next(g for g in json.loads(report.read_text())["gates"] if g["name"] == "quantization")
    assert gate["verdict"] == "fail" and set(gate["measurements"]["suites"]) == {"arith-lm", "choice-lm"}


def test_lm_eval_finds_the_servegate_model_by_name(manifests: dict[str, Path]) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.api.registry import get_model

    from servegate.gates.lm_eval.model import ServegateLM
    from servegate.gates.lm_eval.tasks import task_manager
    from servegate.zoo.lm_eval_tasks import task_dir

    assert get_model("servegate") is ServegateLM
    lm = ServegateLM.create_from_arg_obj({"manifest": str(manifests["base"])}, {"batch_size": 4, "device": "cpu"})
    try:
        results = simple_evaluate(
            model=lm,
            tasks=["zoo_arith_choice"],
            task_manager=task_manager(str(task_dir()), "zoo_arith_choice"),
            limit=8,
            log_samples=True,
            bootstrap_iters=0,
        )
    finally:
        lm.close()
    assert len(results["samples"]["zoo_arith_choice"]) == 8 and len(lm.results) == 8


def test_chosen_items_in_any_order_get_their_own_outputs(base_runs: Any) -> None:
    """What the truncation gate does: re-run some items, in its own order; each keeps its own answer."""
    from servegate.gates.lm_eval.tasks import run_lm_eval

    served, ctx, runs = base_runs
    for data in ctx.suites():
        chosen = [data.items[i] for i in (7, 2, 5, 0)]
        outputs, _ = run_lm_eval(ctx.engines.get(served), data, chosen)
        full = runs[data.name].outputs
        assert [o.id for o in outputs] == ["7", "2", "5", "0"]
        assert [(o.text, o.token_ids, o.scores) for o in outputs] == [
            (full[i].text, full[i].token_ids, full[i].scores) for i in (7, 2, 5, 0)
        ]
