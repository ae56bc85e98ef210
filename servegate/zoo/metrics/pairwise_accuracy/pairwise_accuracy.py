"""pairwise_accuracy: how often a paraphrase scores higher than an unrelated sentence.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``.
Used with the zoo's ``similarity`` suite: for each item, score (prompt, reference) and
(prompt, negative), e.g. by the cosine of their embeddings.
"""

import datasets
import evaluate

_DESCRIPTION = "Share of items whose similar pair scores strictly higher than their unrelated pair."

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of float): score of each item's similar pair (prompt, reference).
    references (list of float): score of the same item's unrelated pair (prompt, negative).
Returns:
    pairwise_accuracy (float): items with predictions[i] > references[i] / items, in [0, 1].
Examples:
    >>> metric = evaluate.load("servegate/zoo/metrics/pairwise_accuracy")
    >>> metric.compute(predictions=[0.9, 0.4], references=[0.1, 0.6])
    {'pairwise_accuracy': 0.5}
"""


class PairwiseAccuracy(evaluate.Metric):
    """Ranking accuracy of similar over unrelated pairs."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("float64"), "references": datasets.Value("float64")}
            ),
        )

    def _compute(self, predictions, references):
        wins = sum(p > r for p, r in zip(predictions, references, strict=True))
        return {"pairwise_accuracy": wins / len(references) if references else 0.0}
