"""The one shape of the zoo's JSON-comparison metrics (field_accuracy, tool_name_match, tool_arguments_match): an
evaluate metric that reads each prediction and reference as JSON and averages a comparison over the items.

Imported only by those metric modules (it imports evaluate and datasets, which are slow to import). A module
subclasses it through the module (`json_metric.JsonComparison`), never importing the class by name: evaluate
takes the first metric class in a module's namespace as the module's own.
"""

from __future__ import annotations

from typing import Any, ClassVar

import datasets
import evaluate

from servegate.zoo.json_fields import parsed


class JsonComparison(evaluate.Metric):
    """Mean over items of `compare(prediction, reference)` on their JSON values; a prediction that is not JSON
    scores 0."""

    key: ClassVar[str]
    """The metric's name: the key of its score."""
    summary: ClassVar[str]
    """evaluate's description."""
    usage: ClassVar[str]
    """evaluate's inputs description (arguments, returns, an example)."""
    compare: ClassVar[staticmethod[[Any, Any], float]]
    """The per-item comparison (a staticmethod of servegate.zoo.json_fields)."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=self.summary,
            citation="",
            inputs_description=self.usage,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(self, predictions: list[str], references: list[str]) -> dict[str, float]:
        scores = []
        for prediction, reference in zip(predictions, references, strict=True):
            ok, value = parsed(prediction)
            scores.append(type(self).compare(value, parsed(reference)[1]) if ok else 0.0)
        return {self.key: sum(scores) / len(scores) if scores else 0.0}
