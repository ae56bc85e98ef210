"""The three task formats the tiny causal LMs learn, shared by the suite generator and training.

Lengths are counted in tokens of the zoo tokenizer: one token per character plus ``<bos>``.

* ``arith``: ``<filler> 773+097=`` -> ``0870``. The operands stand at the very end behind a
  variable-length run of harmless lowercase words, so left truncation is harmless until it cuts
  into the last 8 characters, while right truncation removes the operands.
* ``recall``: ``key=QZKX; <filler> key=`` -> ``QZKX``. The code stands at a fixed place at the
  start, so any truncation that drops the start loses the answer.
* ``json``: ``{"a":"773","b":"097"}`` -> ``{"sum":"0870"}``, valid under ``suites/json.schema.json``.

Every completion is followed by ``<eos>``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

TASKS: tuple[str, ...] = ("arith", "recall", "json")

# Inclusive prompt-length ranges in tokens, <bos> included.
ARITH_PROMPT_TOKENS: tuple[int, int] = (9, 80)
RECALL_PROMPT_TOKENS: tuple[int, int] = (33, 60)
JSON_PROMPT_TOKENS: int = 22

# A left-truncation limit that only ever removes arith filler (every recall and json prompt fits) ...
SAFE_MAX_INPUT_TOKENS: int = 64
# ... and one that keeps every arith operand and json prompt but drops every recall code.
TIGHT_MAX_INPUT_TOKENS: int = 24

# The longest completion (json) is 14 characters; one more token for <eos>.
MAX_NEW_TOKENS: int = 16

# Training draws many short prompts (up to this many tokens over the shortest possible):
# the answer never depends on the filler, and every token costs training time.
SHORT_SPAN = 16

CODE_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
CODE_LENGTH = 4
# Lowercase only, no digits, no "=" and never "key": filler can never look like an operand or a question.
FILLER_WORDS: tuple[str, ...] = (
    "the",
    "a",
    "small",
    "model",
    "reads",
    "this",
    "note",
    "before",
    "it",
    "answers",
    "and",
    "then",
    "we",
    "check",
    "what",
    "comes",
    "out",
    "of",
    "each",
    "line",
    "some",
    "text",
    "is",
    "only",
    "here",
    "to",
    "fill",
    "space",
    "so",
    "that",
    "prompts",
    "have",
    "many",
    "lengths",
    "please",
    "ignore",
    "words",
    "like",
    "these",
    "they",
    "carry",
    "no",
    "meaning",
    "for",
    "task",
    "at",
    "end",
    "when",
    "you",
    "see",
    "sum",
    "write",
    "down",
    "with",
    "four",
    "digits",
    "quiet",
    "river",
    "stone",
    "green",
)
_RECALL_PREFIX_CHARS = len("key=") + CODE_LENGTH + len("; ")
_RECALL_SUFFIX = "key="


@dataclass(frozen=True)
class Example:
    """One prompt and its exact expected completion (without ``<eos>``)."""

    task: str
    prompt: str
    reference: str
    # What must never appear in training when this example is held out: the operands or the code.
    key: str

    @property
    def prompt_tokens(self) -> int:
        """Prompt length in zoo tokens, ``<bos>`` included."""
        return len(self.prompt) + 1


def filler(rng: random.Random, n_chars: int) -> str:
    """Exactly ``n_chars`` characters of filler words ending in a space (may start mid-word)."""
    if n_chars <= 0:
        return ""
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < n_chars:
        words.append(rng.choice(FILLER_WORDS))
    text = " ".join(words) + " "
    # Keep the end: it always closes with a separating space before what follows.
    return text[-n_chars:]


def arith(a: int, b: int, prompt_tokens: int, rng: random.Random) -> Example:
    """An addition prompt of exactly ``prompt_tokens`` tokens with the operands at its end."""
    question = f"{a:03d}+{b:03d}="
    text = filler(rng, prompt_tokens - 1 - len(question)) + question
    return Example("arith", text, f"{a + b:04d}", f"{a:03d}+{b:03d}")


def recall(code: str, prompt_tokens: int, rng: random.Random) -> Example:
    """A recall prompt of exactly ``prompt_tokens`` tokens whose answer is the code at its start."""
    n_filler = prompt_tokens - 1 - _RECALL_PREFIX_CHARS - len(_RECALL_SUFFIX)
    text = f"key={code}; " + filler(rng, n_filler) + _RECALL_SUFFIX
    return Example("recall", text, code, code)


def json_sum(a: int, b: int) -> Example:
    """A JSON-in, JSON-out addition: ``{"a":"773","b":"097"}`` -> ``{"sum":"0870"}``."""
    prompt = f'{{"a":"{a:03d}","b":"{b:03d}"}}'
    return Example("json", prompt, f'{{"sum":"{a + b:04d}"}}', f"{a:03d}+{b:03d}")


def random_code(rng: random.Random) -> str:
    """Four distinct capital letters (distinct so copying one never suggests another)."""
    return "".join(rng.sample(CODE_LETTERS, CODE_LENGTH))


def sample(task: str, rng: random.Random, short: bool = False) -> Example:
    """Draw one example of ``task`` with a length uniform over the task's range.

    ``short`` draws from the shortest lengths instead, down to no filler at all: training uses
    these cheap examples to learn the mechanism (copy the code, add the operands) quickly.
    """

    def length(bounds: tuple[int, int], shortest: int) -> int:
        return rng.randint(shortest, shortest + SHORT_SPAN) if short else rng.randint(*bounds)

    if task == "arith":
        return arith(rng.randrange(1000), rng.randrange(1000), length(ARITH_PROMPT_TOKENS, 9), rng)
    if task == "recall":
        shortest = 1 + _RECALL_PREFIX_CHARS + len(_RECALL_SUFFIX)
        return recall(random_code(rng), length(RECALL_PROMPT_TOKENS, shortest), rng)
    if task == "json":
        return json_sum(rng.randrange(1000), rng.randrange(1000))
    raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
