"""The phases of the contract gate's probes: under load the server is kept full, and alone each distinct prompt
is sent once (a greedy request sent again alone is the same request)."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

from servegate.contracts.manifest import ServedModel
from servegate.gates.base import ProgressHook
from servegate.gates.probes.http_target import Answer
from servegate.gates.probes.probe_phases import phase_prompts, run_phases


class Counted(ProgressHook):
    """Records each bar's total and the steps advanced."""

    def __init__(self) -> None:
        self.total = 0
        self.done = 0

    def start(self, description: str, total: int) -> None:
        self.total = total

    def advance(self, steps: int = 1) -> None:
        self.done += steps


def test_alone_each_prompt_once_under_load_cycled_to_fill_the_server() -> None:
    prompts = ["a", "b", "c"]
    assert phase_prompts(prompts, 4, 8) == {1: ["a", "b", "c"], 4: ["a", "b", "c", "a", "b", "c", "a", "b"]}
    assert phase_prompts(list("abcdefghij"), 4, 8)[1] == list("abcdefgh")  # never more than a load phase sends


def test_run_phases_sends_each_prompt_once_alone_and_counts_the_progress_it_makes() -> None:
    served = ServedModel.model_validate(
        {"name": "m", "weights": {"source": "zoo:tiny-primary"}, "batching": {"mode": "static", "max_batch_size": 4}}
    )
    progress = Counted()
    ctx = SimpleNamespace(candidate=served, progress=progress)
    sent: Counter[tuple[str, str, bool]] = Counter()
    in_flight = peak = 0

    async def send(target: object, probe: str, prompt: str, stream: bool) -> Answer:
        nonlocal in_flight, peak
        sent[(probe, prompt, stream)] += 1
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        return Answer(stream, 8, 200, "{}")

    def judge(probe: str, answer: Answer) -> tuple[bool, str | None]:
        return True, None

    target = SimpleNamespace(label="t")
    measured = asyncio.run(run_phases(ctx, target, ["p"], ["x", "y", "z"], send, judge, "probes"))  # type: ignore[arg-type]
    counts = {(p.concurrency, p.stream): p.answers for p in measured.phases}
    assert counts == {(1, False): 3, (1, True): 3, (4, False): 8, (4, True): 8}
    # alone once plus the load phase's cycle (8 over 3 prompts: x and y thrice, z twice), per stream mode
    assert sent[("p", "x", False)] == 1 + 3 and sent[("p", "z", True)] == 1 + 2
    assert progress.total == progress.done == 22 and peak == 4
