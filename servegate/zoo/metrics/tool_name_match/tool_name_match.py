"""tool_name_match: whether an answer calls the expected functions, in order, and no others.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``. The
comparison itself is servegate.zoo.json_fields.name_match; the metric's shape is
servegate.zoo.json_metric.JsonComparison.
"""

from servegate.zoo import json_fields  # noqa: I001 (evaluate reads one import per line)
from servegate.zoo import json_metric

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


class ToolNameMatch(json_metric.JsonComparison):
    """Whether the calls name the expected functions."""

    key = "tool_name_match"
    summary = _DESCRIPTION
    usage = _KWARGS_DESCRIPTION
    compare = staticmethod(json_fields.name_match)
