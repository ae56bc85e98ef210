"""tool_name_match: whether an answer calls the expected functions, in order, and no others.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``. The
comparison itself is servegate.zoo.json_fields.name_match.
"""

import datasets
import evaluate

from servegate.zoo import json_fields

_DESCRIPTION = "Share of items whose tool calls name exactly the expected functions, in order."

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the calls read from each answer, as a JSON list of {"name", "arguments"}.
    references (list of str): the expected call ({"name", "arguments"}) or calls (a list of them), as JSON.
Returns:
    tool_name_match (float): the mean over items, in [0, 1]; 0.0 for no items.
        A prediction that is not JSON scores 0.
Examples:
    >>> metric = evaluate.load("servegate/zoo/metrics/tool_name_match")
    >>> metric.compute(
    ...     predictions=['[{"name":"get_weather","arguments":{"city":"Oslo"}}]'],
    ...     references=['{"name":"get_weather","arguments":{"city":"Paris"}}'],
    ... )
    {'tool_name_match': 1.0}
"""


class ToolNameMatch(evaluate.Metric):
    """Whether the calls name the expected functions."""

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
            scores.append(json_fields.name_match(value, json_fields.parsed(reference)[1]) if ok else 0.0)
        return {"tool_name_match": sum(scores) / len(scores) if scores else 0.0}
