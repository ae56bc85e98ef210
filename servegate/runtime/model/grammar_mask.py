"""Output constraints enforced as a token mask: llguidance compiles each request's constraint into a matcher over
the model's tokenizer; every step, each constrained row's logits keep only the tokens its matcher allows, and the
sampled token advances the matcher.

The mask is a row's own (its matcher over its own output), so batch invariance holds: a constrained row gives
the same tokens whatever runs beside it. Once a constraint is complete, the only token left is EOS, so the
output ends as an unconstrained one does (finish_reason stop, EOS counted in completion_tokens, as vLLM).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from servegate.contracts.constraint_fields import OutputConstraint
from servegate.contracts.errors import ServingError


class _CharTokens:
    """A tokenizer whose tokens each decode on their own (character or word level), as llguidance's
    TokenizerWrapper takes it: every token's bytes, and an encoder."""

    def __init__(self, tokenizer: Any) -> None:
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = list(tokenizer.all_special_ids)
        special = set(self.special_token_ids)
        self.tokens = [
            tokenizer.convert_ids_to_tokens(i).encode() if i in special else tokenizer.decode([i]).encode()
            for i in range(len(tokenizer))
        ]
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))


def llguidance_tokenizer(tokenizer: Any, eos_ids: Sequence[int]) -> Any:
    """The llguidance view of a Hugging Face fast tokenizer (its own byte-level reading where llguidance knows the
    decoder; else each token's decoded text, right for character and word-level vocabularies)."""
    import llguidance
    import llguidance.hf

    eos = sorted(eos_ids) or None
    try:
        return llguidance.hf.from_tokenizer(tokenizer, eos_token=eos)
    except ValueError:  # a decoder llguidance does not read (the zoo's character tokenizer fuses characters)
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_CharTokens(tokenizer)), eos_token=eos)


class GrammarMask:
    """Compiles constraints for one tokenizer, masks a batch's logits by their matchers, and advances them."""

    def __init__(self, tokenizer: Any, eos_ids: Sequence[int]) -> None:
        import llguidance

        self._ll = llguidance
        self._tokenizer = llguidance_tokenizer(tokenizer, eos_ids)
        self._executor = llguidance.LLExecutor()

    def matcher(self, constraint: OutputConstraint) -> Any:
        """A fresh matcher for one request's constraint; ServingError invalid_constraint (400) when it does not
        compile (a schema feature llguidance lacks, a regex that does not parse, a grammar with errors)."""
        grammar = self._grammar(constraint)
        matcher = self._ll.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ServingError("invalid_constraint", param=constraint.param, detail=_first_line(matcher.get_error()))
        return matcher

    def _grammar(self, constraint: OutputConstraint) -> str:
        ll = self._ll
        try:
            if constraint.kind in ("json_object", "json_schema"):
                return str(
                    ll.LLMatcher.grammar_from_json_schema(
                        constraint.spec, defaults={"whitespace_flexible": not constraint.compact}
                    )
                )
            if constraint.kind == "regex":
                return str(ll.LLMatcher.grammar_from_regex(constraint.spec))
            if constraint.kind == "choice":
                return str(ll.grammar_from("choice", json.loads(constraint.spec)))
            return str(ll.grammar_from("grammar", constraint.spec))
        except ValueError as exc:
            raise ServingError("invalid_constraint", param=constraint.param, detail=_first_line(str(exc))) from None

    def allowed(self, matchers: Sequence[Any], width: int) -> torch.Tensor:
        """[rows, width] bool: the tokens each matcher allows next (ids past the tokenizer's vocabulary: none)."""
        import llguidance.torch as llt

        bitmask = llt.allocate_token_bitmask(len(matchers), self._tokenizer.vocab_size)
        llt.fill_next_token_bitmask_par(self._executor, [(m, row) for row, m in enumerate(matchers)], bitmask)
        shifts = torch.arange(32, dtype=torch.int32)
        bits = ((bitmask[:, :, None] >> shifts) & 1).reshape(len(matchers), -1).bool()
        if bits.shape[1] >= width:
            return bits[:, :width]
        return torch.nn.functional.pad(bits, (0, width - bits.shape[1]), value=False)

    @staticmethod
    def advance(matcher: Any, token: int) -> bool:
        """Feed the sampled token to its matcher; False when the matcher refuses it (a token its own mask
        allowed never is: refusal means the mask and the matcher disagree)."""
        return bool(matcher.consume_token(token))


def apply_mask(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """logits [rows, V] (float32) with every token outside `allowed` [rows, V] at -inf."""
    return logits.float().masked_fill(~allowed.to(logits.device), float("-inf"))


def _first_line(message: str) -> str:
    """The engine's message on one line (its multi-line reports point at a column with a caret)."""
    text = " ".join(message.split())
    return text[:300] if text else "the grammar engine refused it"
