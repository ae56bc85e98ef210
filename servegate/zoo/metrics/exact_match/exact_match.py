"""exact_match: the share of predictions equal to their reference, character for character.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``.
"""

import datasets
import evaluate

_DESCRIPTION = "Share of predictions that equal their reference exactly (optionally after stripping)."

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the model's completions.
    references (list of str): the expected completions.
    strip (bool): strip surrounding whitespace on both sides before comparing (default False).
Returns:
    exact_match (float): matches / items, in [0, 1]; 0.0 for no items.
Examples:
    >>> metric = evaluate.load("servegate/zoo/metrics/exact_match")
    >>> metric.compute(predictions=["0870", "12"], references=["0870", "13"])
    {'exact_match': 0.5}
"""


class ExactMatch(evaluate.Metric):
    """Exact string match rate."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(self, predictions, references, strip=False):
        if strip:
            predictions = [p.strip() for p in predictions]
            references = [r.strip() for r in references]
        matches = sum(p == r for p, r in zip(predictions, references, strict=True))
        return {"exact_match": matches / len(references) if references else 0.0}
