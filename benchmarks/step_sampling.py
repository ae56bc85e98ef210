"""The engine's step sampling (`engine/step_sampling.sample_rows`) with and without a request asking for logprobs.

Every step ends by sampling one row of logits per sequence that reached its last token. Greedy sampling is an argmax;
a request's log-probability is a log-softmax over the whole vocabulary, computed only when a request of the step
asks for logprobs. This script samples the same rows both ways, alternating (asked, quiet, asked, ...), checks both
chose the same tokens, and prints each side's median and min-max in ms and the ratio.

    .venv/bin/python benchmarks/step_sampling.py [--rows 64] [--vocab 32000 49152] [--dtypes float32 bfloat16]
        [--rounds 60] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from types import SimpleNamespace

import torch

from servegate.runtime.engine.step_sampling import SampledTokens, sample_rows
from servegate.runtime.model.sampling import sample_batch
from servegate.runtime.types import SamplingParams


def request(seq_id: int, params: SamplingParams) -> SimpleNamespace:
    """What sample_rows reads of a running request: a greedy one with no grammar and no history."""
    return SimpleNamespace(
        seq=SimpleNamespace(seq_id=seq_id, prompt_token_ids=[]),
        output=SimpleNamespace(token_ids=[], ending_ids=frozenset),
        params=params,
        generator=None,
        matcher=None,
    )


def time_both(logits: torch.Tensor, rounds: int) -> tuple[dict[str, list[float]], bool]:
    """ms per sample_rows call over every row of `logits`, asked and quiet alternating; whether the tokens agree."""
    parts = SimpleNamespace(sampler=sample_batch, grammar=None, tokenizer=None)
    rows = {
        side: [(i, request(i, SamplingParams(logprobs=side == "asked"))) for i in range(logits.shape[0])]
        for side in ("asked", "quiet")
    }
    times: dict[str, list[float]] = {side: [] for side in rows}
    last: dict[str, SampledTokens] = {}
    for _ in range(rounds):
        for side, picked in rows.items():
            began = time.perf_counter()
            last[side] = sample_rows(parts, logits, picked)  # type: ignore[arg-type]
            times[side].append(1000 * (time.perf_counter() - began))
    return times, last["asked"].tokens == last["quiet"].tokens


def main() -> None:
    """Time each (dtype, vocabulary) case and print one line per side and one for the ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64, help="sequences sampled in the step")
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 49152], help="vocabulary sizes")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.rows} rows, {args.threads} threads, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for dtype in args.dtypes:
        for vocab in args.vocab:
            logits = torch.randn(args.rows, vocab, generator=torch.Generator().manual_seed(0)).to(getattr(torch, dtype))
            times, same = time_both(logits, args.rounds)
            for side, ms in times.items():
                spread = f"{statistics.median(ms):6.2f} ms ({min(ms):.2f}-{max(ms):.2f})"
                print(f"{dtype:<9} vocab {vocab:<6} {side:<6} {spread}")
            ratio = statistics.median(times["asked"]) / statistics.median(times["quiet"])
            print(f"{'':<23} asked / quiet: {ratio:.2f}x; same tokens: {same}")


if __name__ == "__main__":
    main()
