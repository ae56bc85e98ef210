"""The zoo's offline metrics: local ``evaluate`` modules, one folder per metric.

``evaluate``'s hub metrics need the network; a local folder whose name equals its ``.py`` file
loads offline, and ``evaluate`` caches it under ``HF_HOME``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servegate.zoo.errors import check_name, inside

METRICS_DIR = Path(__file__).resolve().parent / "metrics"
METRICS: tuple[str, ...] = (
    "exact_match",
    "json_schema_valid",
    "token_agreement",
    "mean_kl",
    "embedding_cosine",
    "pairwise_accuracy",
    "field_accuracy",
    "tool_name_match",
    "tool_arguments_match",
    "text_similarity",
    "contains_answer",
    "format_followed",
)


def metric_path(name: str) -> Path:
    """The folder of the zoo metric ``name`` (what ``evaluate.load`` takes)."""
    check_name("metric", name, METRICS)
    return inside(METRICS_DIR, METRICS_DIR / name)


def load_metric(name: str) -> Any:
    """Load the zoo metric ``name`` as an ``evaluate.EvaluationModule``, offline."""
    import evaluate  # imported here: evaluate pulls in datasets, which most zoo callers never need

    return evaluate.load(str(metric_path(name)))
