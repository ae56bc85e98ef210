"""token_agreement: top-1 agreement of two models' greedy tokens, position by position.

A local evaluate module shipped with servegate; load it with ``evaluate.load(path_to_this_folder)``.
"""

import datasets
import evaluate

_DESCRIPTION = (
    "Share of aligned positions where two models chose the same top-1 token. Feed sequences that are "
    "aligned, ideally each model's argmax on the same (teacher-forced) prefixes; positions present in "
    "only one sequence count as disagreements."
)

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of list of int): the candidate's top-1 token ids, one list per item.
    references (list of list of int): the baseline's top-1 token ids, aligned with predictions.
Returns:
    token_agreement (float): agreeing positions / compared positions, in [0, 1].
    sequence_agreement (float): items whose sequences are identical / items.
    positions (int): compared positions (per item, the longer of the two lengths).
Examples:
    >>> metric = evaluate.load("servegate/zoo/metrics/token_agreement")
    >>> metric.compute(predictions=[[5, 6, 7], [1]], references=[[5, 6, 8], [1]])
    {'token_agreement': 0.75, 'sequence_agreement': 0.5, 'positions': 4}
"""


class TokenAgreement(evaluate.Metric):
    """Top-1 token agreement of two aligned token sequences."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("int64")),
                    "references": datasets.Sequence(datasets.Value("int64")),
                }
            ),
        )

    def _compute(self, predictions, references):
        agree = positions = identical = 0
        for candidate, baseline in zip(predictions, references, strict=True):
            agree += sum(c == b for c, b in zip(candidate, baseline, strict=False))
            positions += max(len(candidate), len(baseline))
            identical += list(candidate) == list(baseline)
        items = len(references)
        return {
            "token_agreement": agree / positions if positions else 1.0,
            "sequence_agreement": identical / items if items else 1.0,
            "positions": positions,
        }
