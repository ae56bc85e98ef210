"""format_followed: the share of answers that obey their item's format rule.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``. Each
reference is a rule as JSON text, {"rule": NAME, ...}: `uppercase` / `lowercase` (the answer has letters, none of
the other case), `integer` (only an integer: sign and digits, surrounding quotes and one final full stop allowed),
`max_words` / `exact_words` with `n`, `one_of` with `options` (the whole answer is one of them, case and
punctuation aside), `starts_with` / `contains` with `text` (whole words, case and punctuation aside; `yes|no`
accepts either), `lines` with `n` (non-blank lines) and `comma_list` with `n` (non-empty items between commas).
The checks are servegate.zoo.answer_checks.RULES; a rule they do not know raises ValueError naming the known ones.
"""

import datasets
import evaluate

from servegate.zoo import answer_checks

_DESCRIPTION = "Share of answers that obey their item's format rule (the reference, a JSON object)."

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the model's answers.
    references (list of str): each item's rule as JSON text, e.g. '{"rule": "max_words", "n": 3}'.
Returns:
    format_followed (float): items whose answer obeys its rule / items, in [0, 1]; 0.0 for no items.
Examples:
    >>> metric = evaluate.load("servegate/zoo/metrics/format_followed")
    >>> metric.compute(predictions=["YES", "seven"], references=['{"rule": "uppercase"}', '{"rule": "integer"}'])
    {'format_followed': 0.5}
"""


class FormatFollowed(evaluate.Metric):
    """Per-item format rules checked on the answer text."""

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
        kept = sum(answer_checks.follows(p, r) for p, r in zip(predictions, references, strict=True))
        return {"format_followed": kept / len(references) if references else 0.0}
