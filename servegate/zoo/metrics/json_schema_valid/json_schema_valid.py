"""json_schema_valid: the share of outputs that parse as JSON and validate under a JSON Schema.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``.
"""

import json

import datasets
import evaluate
import jsonschema

_DESCRIPTION = "Share of outputs that are JSON documents valid under the given JSON Schema."

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the model's outputs.
    schema (dict or str): the JSON Schema, as a dict, a JSON string, or a path to a .json file.
Returns:
    json_schema_valid (float): valid outputs / outputs, in [0, 1].
    json_parse_rate (float): outputs that parse as JSON at all / outputs.
Examples:
    >>> metric = evaluate.load("servegate/zoo/metrics/json_schema_valid")
    >>> metric.compute(predictions=['{"sum":"0870"}', 'oops'], schema={"type": "object"})
    {'json_schema_valid': 0.5, 'json_parse_rate': 0.5}
"""


def _load_schema(schema):
    if isinstance(schema, dict):
        return schema
    if isinstance(schema, str) and schema.lstrip().startswith("{"):
        return json.loads(schema)
    with open(schema, encoding="utf-8") as handle:
        return json.load(handle)


class JsonSchemaValid(evaluate.Metric):
    """Rate of outputs valid under a JSON Schema."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("string")}),
        )

    def _compute(self, predictions, schema=None):
        if schema is None:
            raise ValueError("json_schema_valid needs schema=<dict, JSON string or path to a .json file>")
        validator_class = jsonschema.validators.validator_for(_load_schema(schema))
        validator = validator_class(_load_schema(schema))
        parsed = valid = 0
        for text in predictions:
            try:
                document = json.loads(text)
            except ValueError:
                continue
            parsed += 1
            valid += validator.is_valid(document)
        total = len(predictions)
        return {
            "json_schema_valid": valid / total if total else 0.0,
            "json_parse_rate": parsed / total if total else 0.0,
        }
