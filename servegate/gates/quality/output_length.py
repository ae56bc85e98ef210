"""The output-length guard of every quality comparison: answers must not get shorter (or longer) to pass.

MLPerf checks generated length beside accuracy (at least 90% of the reference's, 90-110% for some models),
because a variant that stops early can keep exact match on short answers while its long ones are cut.
The guard compares the candidate's mean generated tokens per item with the baseline's, by suite, on the
items both answered, against `quality.length_band` (in characters when the candidate is a remote).
"""

from __future__ import annotations

from servegate.contracts.quality_section import LengthBand
from servegate.contracts.report.quality import OutputLength
from servegate.gates.result import Verdict
from servegate.gates.suites.evaluation import ItemOutput


def output_length(
    suite: str, baseline: list[ItemOutput], candidate: list[ItemOutput], band: LengthBand, *, tokens: bool = True
) -> OutputLength:
    """Compare mean generated tokens per item over the items both sides answered, against `band`.

    `tokens=False` counts characters: for a remote candidate, whose token ids may be its own engine's (with the
    end-of-sequence token) or servegate's re-tokenized text (without), so only the text is counted alike.
    """
    pairs = [(b, c) for b, c in zip(baseline, candidate, strict=True) if b.error is None and c.error is None]
    by_tokens = tokens and all(o.token_ids or not o.text for pair in pairs for o in pair)
    base = [len(b.token_ids) if by_tokens else len(b.text or "") for b, _ in pairs]
    cand = [len(c.token_ids) if by_tokens else len(c.text or "") for _, c in pairs]
    n = len(pairs)
    b_mean = sum(base) / n if n else 0.0
    c_mean = sum(cand) / n if n else 0.0
    ratio = c_mean / b_mean if b_mean > 0 else None
    verdict: Verdict = "pass" if ratio is None or band.low <= ratio <= band.high else "fail"
    unit = "tokens" if by_tokens else "characters"
    return OutputLength(
        suite=suite,
        items=n,
        unit=unit,
        baseline_mean_tokens=round(b_mean, 4),
        candidate_mean_tokens=round(c_mean, 4),
        ratio=None if ratio is None else round(ratio, 4),
        band_low=band.low,
        band_high=band.high,
        verdict=verdict,
    )


def length_reason(guard: OutputLength) -> str:
    """One line naming the guard's figures."""
    if guard.ratio is None:
        return f"{guard.suite}: no generated tokens on the baseline ({guard.items} items): length not compared"
    where = "inside" if guard.verdict == "pass" else "outside"
    return (
        f"{guard.suite}: mean generated {guard.unit} {guard.candidate_mean_tokens:.2f} vs baseline "
        f"{guard.baseline_mean_tokens:.2f} per item (ratio {guard.ratio:.3f}, {where} quality.length_band "
        f"{guard.band_low:g}-{guard.band_high:g}, n={guard.items})"
    )
