"""tool_arguments_match: how many of the expected calls' arguments are right, per item.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``. The
comparison itself is servegate.zoo.json_fields.arguments_match.
"""

import datasets
import evaluate

from servegate.zoo import json_fields

_DESCRIPTION = (
    "Mean over expected calls of the share of arguments (JSON leaves) either "
    "side holds on which both agree; a call of another function scores 0."
)

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the calls read from each answer, as a JSON list of {"name", "arguments"}.
    references (list of str): the expected call ({"name", "arguments"}) or calls (a list of them), as JSON.
Returns:
    tool_arguments_match (float): the mean over items, in [0, 1]; 0.0 for no items.
        A prediction that is not JSON scores 0.
Examples:
    >>> metric = evaluate.load("servegate/zoo/metrics/tool_arguments_match")
    >>> metric.compute(
    ...     predictions=['[{"name":"set_timer","arguments":{"minutes":5,"label":"tea"}}]'],
    ...     references=['{"name":"set_timer","arguments":{"minutes":5}}'],
    ... )
    {'tool_arguments_match': 0.5}
"""


class ToolArgumentsMatch(evaluate.Metric):
    """Argument-by-argument agreement of tool calls with the expected ones."""

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
            scores.append(json_fields.arguments_match(value, json_fields.parsed(reference)[1]) if ok else 0.0)
        return {"tool_arguments_match": sum(scores) / len(scores) if scores else 0.0}
