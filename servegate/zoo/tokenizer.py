"""The character-level tokenizer shared by the zoo's causal LMs.

One token per character of printable ASCII (plus newline), four special tokens, and a
post-processor that puts ``<bos>`` in front of every encoded text. Saved as a plain
``tokenizer.json`` so ``AutoTokenizer.from_pretrained(dir)`` loads it with no custom code.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
# Ids are fixed by this order; the model configs and the runtime's tests rely on pad=0, bos=1, eos=2.
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

CHARACTERS: str = "\n" + "".join(chr(c) for c in range(32, 127))
assert len(set(CHARACTERS)) == len(CHARACTERS) and set(string.digits) <= set(CHARACTERS)


def vocabulary() -> dict[str, int]:
    """Token -> id for the special tokens followed by every character."""
    tokens = list(SPECIAL_TOKENS) + list(CHARACTERS)
    return {token: index for index, token in enumerate(tokens)}


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Build the zoo's character-level tokenizer (left padding, ``<bos>`` added to every text)."""
    core = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token=UNK))
    # Every single character is its own pre-token; the class [\s\S] also matches the newline.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, BOS_ID)]
    )
    # Fuse joins characters back without the spaces WordLevel would otherwise insert.
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        # Decoder-only generation pads on the left so every prompt ends at the last position.
        padding_side="left",
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )
