"""Streaming consistency, after MLPerf's TEST06: what a streamed answer must agree with, checked per answer.

For every streamed answer and its non-streamed twin (the same prompt, greedy, sent under the same load):
the streamed text equals the twin's; the first streamed token is the first token of the final text (its
first chunk is a prefix of the twin's text); exactly one finish_reason, with no text after it (at most one
end of sequence); `usage.completion_tokens` equals the tokens received; and no answer has more tokens
than its `max_tokens`.

Tokens received are the ids the server sent when it sends them (`return_token_ids`: vLLM, and servegate's own
server, which HttpTarget asks for them), and then usage must count exactly as many: the ids are every token
generated, an end-of-sequence or stop token included. Otherwise the text is counted by the manifest's tokenizer,
which is only an estimate (re-tokenizing generated text need not give back the tokens generated: a real BPE
model's runs of whitespace re-tokenize into fewer), and an answer that ended on "stop" may count one token more
than its text (the end-of-sequence token is generated but never text) plus the tokens of a stop string it cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from servegate.contracts.report.probes import StreamingUnderLoad
from servegate.gates.probes.http_target import Answer

Counter = Callable[[Answer], int]
"""Tokens received in an answer (HttpTarget.tokens_received)."""


@dataclass
class StreamFindings:
    """Per-answer problems, in words, as the check finds them."""

    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("twin", "first", "eos", "usage", "max_tokens"), 0)
    )

    def add(self, kind: str, problem: str) -> None:
        """Count one problem of `kind` and keep its description."""
        self.counts[kind] += 1
        self.problems.append(problem)


def check_pair(label: str, streamed: Answer, plain: Answer, findings: StreamFindings) -> None:
    """A streamed answer against its non-streamed twin: same text, and its first chunk starts the final text."""
    if streamed.text != plain.text:
        findings.add("twin", f"{label}: streamed text ({len(streamed.text)} chars) differs from the non-streamed "
                             f"answer ({len(plain.text)} chars)")  # fmt: skip
    if streamed.chunks and not plain.text.startswith(streamed.chunks[0]):
        findings.add("first", f"{label}: the first streamed token {streamed.chunks[0]!r} is not the start of the "
                              "final text")  # fmt: skip


def check_answer(label: str, answer: Answer, count: Counter, stop_slack: int, findings: StreamFindings) -> None:
    """One answer's end of sequence, usage and max_tokens (`stop_slack`: tokens a stop string may take)."""
    kind = "stream" if answer.stream else "answer"
    if len(answer.finish_reasons) != 1 or answer.text_after_finish:
        findings.add("eos", f"{label}: {kind} carried {len(answer.finish_reasons)} finish_reason(s)"
                            + (" and text after the finish" if answer.text_after_finish else ""))  # fmt: skip
    received = count(answer)
    reported = answer.completion_tokens
    ended_on_stop = answer.finish_reasons[-1:] == ("stop",)
    # ids are every token generated; re-tokenized text lacks the end of sequence and a cut stop string
    slack = (1 + stop_slack) if ended_on_stop and answer.token_ids is None else 0
    if reported is None or not received <= reported <= received + slack:
        findings.add("usage", f"{label}: usage.completion_tokens is {reported}, the {kind} carried {received} "
                              "token(s)")  # fmt: skip
    most = max(received, reported or 0)
    if most > answer.max_tokens:
        findings.add("max_tokens", f"{label}: {most} tokens for max_tokens {answer.max_tokens}")


def streaming_consistency(
    pairs: Sequence[tuple[str, Answer, Answer]],
    singles: Sequence[tuple[str, Answer]],
    count: Counter,
    *,
    concurrency: int,
    stop_slack: int = 0,
) -> tuple[StreamingUnderLoad, list[str]]:
    """Check (label, streamed, plain) twins and further (label, answer)s; the measurements and the problems."""
    findings = StreamFindings()
    streams = answers = refused = 0
    for label, streamed, plain in pairs:
        if streamed.ok and plain.ok:
            streams += 1
            check_pair(label, streamed, plain, findings)
    everything = [(label, a) for label, s, p in pairs for a in (s, p)] + list(singles)
    for label, answer in everything:
        if not answer.ok:
            refused += 1
            continue
        answers += 1
        check_answer(label, answer, count, stop_slack, findings)
    with_ids = any(a.token_ids is not None for _, a in everything)
    measured = StreamingUnderLoad(
        concurrency=concurrency,
        streams=streams,
        answers=answers,
        refused=refused,
        twin_mismatches=findings.counts["twin"],
        first_token_mismatches=findings.counts["first"],
        end_of_sequence_violations=findings.counts["eos"],
        usage_miscounts=findings.counts["usage"],
        max_tokens_exceeded=findings.counts["max_tokens"],
        token_count="token ids" if with_ids else "tokenizer",
    )
    return measured, findings.problems
