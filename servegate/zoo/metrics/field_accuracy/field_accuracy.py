"""field_accuracy: how many of an extracted object's fields are right, per item.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``. The
comparison itself is servegate.zoo.json_fields.agreement; the metric's shape is
servegate.zoo.json_metric.JsonComparison.
"""

from servegate.zoo import json_fields  # noqa: I001 (evaluate reads one import per line)
from servegate.zoo import json_metric

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


class FieldAccuracy(json_metric.JsonComparison):
    """Field-by-field agreement of JSON outputs with their references."""

    key = "field_accuracy"
    summary = _DESCRIPTION
    usage = _KWARGS_DESCRIPTION
    compare = staticmethod(json_fields.agreement)
