"""The embedded default: small trained models, eval suites and offline metrics that ship with servegate.

* ``zoo_model_path(name)`` / ``list_models()``: the models (``tiny-primary``, ``tiny-fallback``, ``minilm``).
* ``suite_path(name, split)`` / ``load_suite(name_or_path, split, limit)``: the eval suites.
* ``metric_path(name)`` / ``load_metric(name)``: local ``evaluate`` modules that work offline.
"""

from servegate.zoo.catalog import ZooModelInfo, checksum_mismatches, list_models, zoo_model_path
from servegate.zoo.errors import ZooError
from servegate.zoo.eval_suites import SPLITS, SUITES, json_output_schema, load_suite, suite_path
from servegate.zoo.evaluate_modules import METRICS, load_metric, metric_path
from servegate.zoo.tasks import MAX_NEW_TOKENS, SAFE_MAX_INPUT_TOKENS, TIGHT_MAX_INPUT_TOKENS

__all__ = [
    "MAX_NEW_TOKENS",
    "METRICS",
    "SAFE_MAX_INPUT_TOKENS",
    "SPLITS",
    "SUITES",
    "TIGHT_MAX_INPUT_TOKENS",
    "ZooError",
    "ZooModelInfo",
    "checksum_mismatches",
    "json_output_schema",
    "list_models",
    "load_metric",
    "load_suite",
    "metric_path",
    "suite_path",
    "zoo_model_path",
]
