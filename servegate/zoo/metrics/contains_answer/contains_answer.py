"""contains_answer: the share of answers that say their reference word, as whole words, case and punctuation aside.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``. Both sides are
normalised (casefolded; every run of characters that are not letters or digits becomes one space), and an item
scores 1 when the normalised reference occurs in the normalised answer between word boundaries: `Paris` is in
"The capital is Paris." but not in "Parisian", `new delhi` is in "It's New-Delhi!". A reference may list
alternatives separated by `|` (`4|four`); any one counts. A reference that normalises to nothing never matches.
The check itself is servegate.zoo.answer_checks.contains_answer.
"""

import datasets
import evaluate

from servegate.zoo import answer_checks

_DESCRIPTION = (
    "Share of answers in which the reference (or one of its |-separated alternatives) occurs as whole words, "
    "case- and punctuation-insensitive."
)

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the model's answers.
    references (list of str): the expected word or words; alternatives separated by `|`.
Returns:
    contains_answer (float): items whose answer contains their reference / items, in [0, 1]; 0.0 for no items.
Examples:
    >>> metric = evaluate.load("servegate/zoo/metrics/contains_answer")
    >>> metric.compute(predictions=["The capital is Paris.", "It has 6 legs"], references=["paris", "8|eight"])
    {'contains_answer': 0.5}
"""


class ContainsAnswer(evaluate.Metric):
    """Whole-word, normalised occurrence of the reference in the answer."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(self, predictions, references):
        hits = sum(answer_checks.contains_answer(p, r) for p, r in zip(predictions, references, strict=True))
        return {"contains_answer": hits / len(references) if references else 0.0}
