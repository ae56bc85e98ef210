"""embedding_cosine: cosine similarity of two embedding models' vectors for the same inputs.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Mean and minimum cosine similarity between candidate and baseline embeddings of the same inputs."

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of list of float): the candidate's embedding of each input.
    references (list of list of float): the baseline's embedding of the same inputs.
Returns:
    mean_cosine (float): mean cosine similarity, in [-1, 1]; 1 when the vectors point the same way.
    min_cosine (float): the smallest cosine similarity of any input.
Examples:
    >>> metric = evaluate.load("servegate/zoo/metrics/embedding_cosine")
    >>> metric.compute(predictions=[[1.0, 0.0], [0.0, 2.0]], references=[[2.0, 0.0], [1.0, 0.0]])
    {'mean_cosine': 0.5, 'min_cosine': 0.0}
"""


class EmbeddingCosine(evaluate.Metric):
    """Cosine similarity of paired embeddings."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("float64")),
                    "references": datasets.Sequence(datasets.Value("float64")),
                }
            ),
        )

    def _compute(self, predictions, references):
        candidate = np.asarray(predictions, dtype=np.float64)
        baseline = np.asarray(references, dtype=np.float64)
        if candidate.shape != baseline.shape:
            raise ValueError(f"shapes differ: predictions {candidate.shape}, references {baseline.shape}")
        norms = np.linalg.norm(candidate, axis=-1) * np.linalg.norm(baseline, axis=-1)
        # A zero vector has no direction: it counts as cosine 0, never as a division error.
        cosine = np.where(norms > 0, (candidate * baseline).sum(axis=-1) / np.where(norms > 0, norms, 1.0), 0.0)
        if cosine.size == 0:
            return {"mean_cosine": 1.0, "min_cosine": 1.0}
        return {"mean_cosine": float(cosine.mean()), "min_cosine": float(cosine.min())}
