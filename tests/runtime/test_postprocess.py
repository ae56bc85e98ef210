"""Postprocess: incremental detokenization with real tokenizers, stop strings, EOS, length, schema checks."""

from __future__ import annotations

import pytest
from runtime_factories import ToyTokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from servegate.runtime.postprocess import OutputStream, OutputValidator
from servegate.zoo.tokenizer import build_char_tokenizer

TEXT = "Grüße aus Köln: 日本語のテキスト, naïve café — ok. " * 20


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE whose merges split multi-byte characters across tokens."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"]))
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>")


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-style tokenizer (words carry their leading space as '▁')."""
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Metaspace()
    core.decoder = decoders.Metaspace()
    core.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<eos>"]))
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>")


def stream(tokenizer, prompt: list[int], output: list[int], **kw) -> tuple[str, OutputStream]:
    out = OutputStream(tokenizer, max_tokens=len(output), prompt_token_ids=prompt, **kw)
    text = "".join(out.add(t).text for t in output)
    return text, out


@pytest.mark.parametrize("make", [byte_level_tokenizer, metaspace_tokenizer, build_char_tokenizer])
def test_streamed_deltas_add_up_to_the_decoded_output(make) -> None:
    tok = make()
    ids = tok.encode(TEXT[:120], add_special_tokens=False)
    prompt, output = ids[:10], ids[10:]
    text, out = stream(tok, prompt, output)
    whole = tok.decode(prompt + output, skip_special_tokens=True)
    assert text == out.text == whole[len(tok.decode(prompt, skip_special_tokens=True)) :]
    assert "\ufffd" not in text


def test_an_incomplete_character_is_held_until_its_last_byte() -> None:
    tok = byte_level_tokenizer()
    ids = tok.encode("日本語", add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "the test needs a character split across tokens"
    out = OutputStream(tok, max_tokens=10)
    deltas = [out.add(i).text for i in ids]
    assert all("\ufffd" not in d for d in deltas) and "".join(deltas) == "日本語"


def test_the_earliest_stop_string_wins_and_the_holdback_is_released_at_the_end() -> None:
    tok = ToyTokenizer()
    ids = [4, 5, 6, 7, 8, 9]  # pieces: e, ff, g, hh, i, jj
    out = OutputStream(tok, max_tokens=10, stop=("hhi", "gh"))
    deltas = [out.add(i) for i in ids[:4]]  # "gh" completes with the fourth token ("hhi" would come later)
    assert [d.finish_reason for d in deltas] == [None, None, None, "stop"]
    assert out.text == "eff" and "".join(d.text for d in deltas) == "eff"
    assert [d.text for d in deltas[:3]] == ["", "e", "f"]  # two characters held back for "hhi"
    plain = OutputStream(tok, max_tokens=3, stop=("zzz",))
    assert "".join(plain.add(i).text for i in ids[:3]) == "effg" and plain.finish_reason == "length"


def test_eos_ends_without_text_unless_ignored() -> None:
    tok = ToyTokenizer()
    out = OutputStream(tok, max_tokens=5, eos_token_ids=frozenset({2}))
    assert out.add(4).finish_reason is None
    delta = out.add(2)
    assert delta.finish_reason == "eos" and out.text == "e" and out.token_ids == [4, 2]
    ignoring = OutputStream(tok, max_tokens=5, eos_token_ids=frozenset({2}), ignore_eos=True)
    assert ignoring.add(2).finish_reason is None
    with pytest.raises(RuntimeError):
        out.add(4)


def test_validator_names_what_is_wrong() -> None:
    validator = OutputValidator({"type": "object", "properties": {"sum": {"type": "string"}}, "required": ["sum"]})
    assert validator.problem('{"sum": "0870"}') is None
    assert validator.problem('{"sum": 870}') == "870 is not of type 'string' at /sum"
    assert "required" in validator.problem("{}")
    assert validator.problem("{'sum'").startswith("not JSON")
