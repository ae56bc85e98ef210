"""text_similarity: how close each output is to its reference, character by character (difflib's ratio).

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``. For items
whose reference is one good answer among many (a function body, a sentence), where exact match is near 0 for
any model: a candidate that drifts from the baseline's answers drifts in this score too, item by item.
"""

import difflib

import datasets
import evaluate

_DESCRIPTION = "Mean over items of difflib.SequenceMatcher's ratio (2 x matched characters / total characters)."

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the model's outputs.
    references (list of str): the expected outputs.
Returns:
    text_similarity (float): the mean ratio, in [0, 1] (1: equal texts); 0.0 for no items.
Examples:
    >>> metric = evaluate.load("servegate/zoo/metrics/text_similarity")
    >>> metric.compute(predictions=["return a + b"], references=["return a - b"])
    {'text_similarity': 0.9166666666666666}
"""


class TextSimilarity(evaluate.Metric):
    """Character-level similarity of outputs to references."""

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
        # autojunk off: its heuristic drops characters that are common in code (spaces), changing the ratio
        ratios = [
            difflib.SequenceMatcher(None, p, r, autojunk=False).ratio()
            for p, r in zip(predictions, references, strict=True)
        ]
        return {"text_similarity": sum(ratios) / len(ratios) if ratios else 0.0}
