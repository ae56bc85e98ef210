"""tool_arguments_match: how many of the expected calls' arguments are right, per item.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``. The
comparison itself is servegate.zoo.json_fields.arguments_match; the metric's shape is
servegate.zoo.json_metric.JsonComparison.
"""

from servegate.zoo import json_fields  # noqa: I001 (evaluate reads one import per line)
from servegate.zoo import json_metric

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


class ToolArgumentsMatch(json_metric.JsonComparison):
    """Argument-by-argument agreement of tool calls with the expected ones."""

    key = "tool_arguments_match"
    summary = _DESCRIPTION
    usage = _KWARGS_DESCRIPTION
    compare = staticmethod(json_fields.arguments_match)
