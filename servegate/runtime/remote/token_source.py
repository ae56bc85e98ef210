"""Which token ids a remote's answer stands for, when the remote does not send its ids.

Only vLLM sends the ids it generated (`return_token_ids`). Every OpenAI-compatible server (TGI, SGLang,
llama.cpp, servegate's own) names its tokens in the answer's logprobs instead: `tokens` holds each token's
own text, EOS included. The manifest's tokenizer reads those names back as ids, so a remote that answers
like the reference answers with the reference's ids. When a name does not read back as exactly one id, or
the remote gave no logprobs, the text is re-tokenized: those ids lack the EOS and may split the text
differently, so the gates then let the text decide (`FinishEvent.token_source` says which it was).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servegate.runtime.types import TokenSource, token_id_of


class TokenReader:
    """Reads a remote's token names (its logprobs `tokens`) as the manifest tokenizer's ids."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._ids: dict[str, int | None] = {}
        self._vocab: dict[str, int] | None = None

    def id_of(self, name: str) -> int | None:
        """The one id whose own text is `name`, None when the tokenizer has no such single token."""
        if name in self._ids:
            return self._ids[name]
        result = token_id_of(name)
        if result is None:
            result = self._encoded(name)
        self._ids[name] = result
        return result

    def _encoded(self, name: str) -> int | None:
        """The id `name` encodes to when it is one token that decodes back to itself, else its vocabulary entry."""
        if name:
            ids = list(self.tokenizer(name, add_special_tokens=False)["input_ids"])
            if len(ids) == 1 and self.tokenizer.decode(ids) == name:
                return int(ids[0])
        if self._vocab is None:  # special tokens (EOS as "<eos>") are written as in the vocabulary
            self._vocab = dict(self.tokenizer.get_vocab())
        return self._vocab.get(name)

    def ids_of(self, names: Sequence[str]) -> list[int] | None:
        """Every name's id in order, None when any one has none."""
        ids = []
        for name in names:
            found = self.id_of(name)
            if found is None:
                return None
            ids.append(found)
        return ids

    def text_ids(self, text: str) -> list[int]:
        """The text re-tokenized (the last resort: no EOS, and the split may not be the remote's)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def answer_tokens(
    reader: TokenReader, remote_ids: Sequence[int], names: Sequence[str], text: str
) -> tuple[list[int], TokenSource]:
    """The answer's token ids and where they came from: the remote's ids, its logprobs' token names, the text."""
    if remote_ids:
        return list(remote_ids), "remote"
    if names:
        ids = reader.ids_of(names)
        if ids is not None:
            return ids, "logprobs"
    return reader.text_ids(text), "tokenizer"
