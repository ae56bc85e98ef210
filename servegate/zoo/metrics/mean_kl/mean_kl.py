"""mean_kl: mean KL divergence between two models' next-token distributions.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = (
    "Mean over positions of KL(baseline || candidate) between next-token distributions, in nats. "
    "Each row is one position's logits or log-probabilities over the vocabulary; rows are normalised "
    "with a log-softmax first, so either form gives the same answer."
)

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of list of float): the candidate's logits (or log-probs), one row per position.
    references (list of list of float): the baseline's logits (or log-probs) at the same positions.
Returns:
    mean_kl (float): mean KL(baseline || candidate) in nats; 0 when the distributions are equal.
    max_kl (float): the largest KL of any position.
    positions (int): rows compared.
Examples:
    >>> metric = evaluate.load("servegate/zoo/metrics/mean_kl")
    >>> metric.compute(predictions=[[0.0, 0.0]], references=[[0.0, 0.0]])
    {'mean_kl': 0.0, 'max_kl': 0.0, 'positions': 1}
"""


def _log_softmax(rows):
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class MeanKl(evaluate.Metric):
    """Mean KL divergence between next-token distributions."""

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
        candidate = _log_softmax(np.asarray(predictions, dtype=np.float64))
        baseline = _log_softmax(np.asarray(references, dtype=np.float64))
        if candidate.shape != baseline.shape:
            raise ValueError(f"shapes differ: predictions {candidate.shape}, references {baseline.shape}")
        if candidate.shape[0] == 0:
            return {"mean_kl": 0.0, "max_kl": 0.0, "positions": 0}
        # KL(p || q) = sum p (log p - log q), per row; clipped at 0 against rounding.
        per_row = np.maximum((np.exp(baseline) * (baseline - candidate)).sum(axis=-1), 0.0)
        return {"mean_kl": float(per_row.mean()), "max_kl": float(per_row.max()), "positions": int(len(per_row))}
