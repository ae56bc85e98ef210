"""Never-seen prompts of a probe's shape, for the response-cache detector's uncached baseline.

A variant keeps the probe's length in tokens and its head, and replaces a window of tokens just before its
last one: the content is new, so no cache of whole responses can hold it, while a prefix cache finds the head
exactly as it finds it for the probe's own repeats (a prefix hit must not pass for a response-cache hit). The
last token is kept because it is often the cue that shapes the answer ("=", ":", a newline), and the window's
digits and letters are first swapped for others of the prompt's own (punctuation stays), so the variant keeps
the probe's format and its answer the probe's form and length: a JSON prompt stays JSON, a sum stays a sum.
Without a tokenizer the unit is the character.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from servegate.gates.probes.http_probe import random_text

WINDOW_TOKENS = 8
"""Tokens replaced before the probe's last token: enough that no two variants need coincide, few enough that a
prefix cache's hits on the probe and on its variants differ by at most one block and this window."""
ATTEMPTS = 48
"""Tries at a variant of exactly the probe's length in tokens (a tokenizer may merge the new text differently)."""


class UnseenPrompts:
    """Makes variants of probe prompts that nothing has been sent before (module docstring)."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.unit = "tokens" if tokenizer is not None else "characters"
        self._encode: Callable[[str], list[Any]]
        self._decode: Callable[[list[Any]], str]
        if tokenizer is None:
            self._encode, self._decode = list, "".join
        else:
            self._encode = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])
            self._decode = lambda ids: tokenizer.decode(ids, clean_up_tokenization_spaces=False)
        self.sent: set[str] = set()
        """Every prompt the audit has sent or will send: no variant repeats one of them."""

    def length(self, prompt: str) -> int:
        """The prompt's length in this helper's unit."""
        return len(self._encode(prompt))

    def _kind(self, token: Any) -> tuple[bool, str] | None:
        """A token's kind, for a like-for-like swap: digits for digits, letters for letters (and a leading space
        kept); None for anything else (punctuation, the structure of the prompt, stays where it is)."""
        text = self._decode([token])
        word = text.strip()
        kind = "digit" if word.isdigit() else "alpha" if word.isalpha() else None
        return None if kind is None else (text[:1].isspace(), kind)

    def _like_for_like(self, ids: list[Any], start: int, end: int, rng: random.Random) -> list[Any] | None:
        """`ids` with each digit or letter token of the window swapped for one of the same kind from the prompt;
        None when no such swap exists (the window is all punctuation, or each kind has a single token)."""
        kinds = [self._kind(t) for t in ids]
        pools: dict[tuple[bool, str], list[Any]] = {}
        for token, kind in zip(ids, kinds, strict=True):
            if kind is not None and token not in pools.setdefault(kind, []):
                pools[kind].append(token)
        swappable = [(i, kind) for i in range(start, end) if (kind := kinds[i]) is not None and len(pools[kind]) > 1]
        if not swappable:
            return None
        out = list(ids)
        for i, kind in swappable:
            out[i] = rng.choice(pools[kind])
        return out

    def variant(self, prompt: str, rng: random.Random) -> str:
        """A prompt of `prompt`'s length never sent before (the nearest length found, when none matched exactly).

        Tries in turn: like-for-like swaps in the window (the probe's format kept, so its answer keeps its form and
        length: a JSON prompt stays JSON), any of the probe's tokens, then new words."""
        self.sent.add(prompt)
        ids = self._encode(prompt)
        n = len(ids)
        end = n - 1 if n > 1 else n
        start = max(0, end - WINDOW_TOKENS)
        head, tail = self._decode(ids[:start]), self._decode(ids[end:])
        pool = sorted(set(ids[:end]), key=str)
        window_chars = max(1, len(self._decode(ids[start:end])))
        best: tuple[int, str] | None = None
        for attempt in range(ATTEMPTS):
            swapped = self._like_for_like(ids, start, end, rng) if attempt < ATTEMPTS // 3 else None
            if swapped is not None:
                text = self._decode(swapped)
            elif len(pool) > 1 and attempt < 2 * ATTEMPTS // 3:
                text = self._decode(ids[:start] + [rng.choice(pool) for _ in range(end - start)] + ids[end:])
            else:  # new words, their length walked around the window's (merges differ between tokenizers)
                chars = max(1, window_chars + (attempt % 7) - 3)
                text = head + random_text(rng, chars) + tail
            if text in self.sent:
                continue
            miss = abs(self.length(text) - n)
            if miss == 0:
                best = (0, text)
                break
            if best is None or miss < best[0]:
                best = (miss, text)
        text = best[1] if best is not None else prompt + " " + random_text(rng, 16)  # new words: never sent before
        self.sent.add(text)
        return text
