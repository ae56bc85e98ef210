"""field_accuracy: how many of an extracted object's fields are right, per item.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``. The
comparison itself is servegate.zoo.json_fields.agreement.
"""

import datasets
import evaluate

from servegate.zoo import json_fields

_DESCRIPTION = (
    "Share of the fields (JSON leaves) either the output or "
    "the reference holds on which both agree, averaged over items."
)

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the model's JSON outputs.
    references (list of str): the expected JSON values.
Returns:
    field_accuracy (float): the mean over items, in [0, 1]; 0.0 for no items.
        A prediction that is not JSON scores 0.
Examples:
    >>> metric = evaluate.load("servegate/zoo/metrics/field_accuracy")
    >>> metric.compute(
    ...     predictions=['{"name":"Ada","age":36}'],
    ...     references=['{"name":"Ada","age":37}'],
    ... )
    {'field_accuracy': 0.5}
"""


class FieldAccuracy(evaluate.Metric):
    """Field-by-field agreement of JSON outputs with their references."""

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
        scores = []
        for prediction, reference in zip(predictions, references, strict=True):
            ok, value = json_fields.parsed(prediction)
            scores.append(json_fields.agreement(value, json_fields.parsed(reference)[1]) if ok else 0.0)
        return {"field_accuracy": sum(scores) / len(scores) if scores else 0.0}
