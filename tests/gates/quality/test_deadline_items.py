"""Items that hit their deadline say how busy the machine was, not what the model answered: the paired tests
leave them out and the comparison is at best a warning that says so; a loss on the items that did answer still
fails."""

from __future__ import annotations

from support.manifests import real_manifest

from servegate.contracts.manifest import ServedModel
from servegate.contracts.quality_section import Suite
from servegate.gates.quality.comparison import QualityComparison, compare_runs
from servegate.gates.suites.evaluation import ItemOutput, SuiteItem, SuiteRun, make_suite_data

ITEMS = 400
SERVED = ServedModel.model_validate(real_manifest("zoo:tiny-primary"))
DATA = make_suite_data(Suite(name="arith", dataset="zoo:arith"), [SuiteItem(str(i), "1+1=", "2") for i in range(ITEMS)])


def run(answers: list[str | None]) -> SuiteRun:
    """One side's outputs: a text (scored right when it is "2"), or None for an item that hit its deadline."""
    outputs = [
        ItemOutput(str(i), text, error=None if text is not None else "deadline_exceeded", finish_reason="stop")
        for i, text in enumerate(answers)
    ]
    return SuiteRun(DATA, outputs, {"exact_match": [float(text == "2") for text in answers]})


def compared(candidate: list[str | None]) -> QualityComparison:
    out = QualityComparison()
    compare_runs(SERVED, DATA, run(["2"] * ITEMS), run(candidate), out)
    return out


def test_items_past_their_deadline_leave_the_paired_tests_and_the_verdict_is_a_warning() -> None:
    slow = compared([None] * 60 + ["2"] * (ITEMS - 60))
    assert slow.timed_out == {"arith": 60} and slow.verdict == "warn"
    assert slow.reason().startswith("inconclusive: items ended deadline_exceeded (60 of arith)")
    [(_, test)] = slow.tests
    assert test.n == ITEMS - 60 and test.verdict == "pass"  # the items that answered are all right
    assert compared(["2"] * ITEMS).verdict == "pass"


def test_a_loss_on_the_items_that_answered_still_fails() -> None:
    worse = compared([None] * 60 + ["3"] * 60 + ["2"] * (ITEMS - 120))
    assert worse.verdict == "fail" and worse.reason().startswith("arith/exact_match: ")
