"""Token agreement and KL between two models' next-token distributions, on tiny random Llama checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.models import save_tiny_llama
from transformers import LlamaForCausalLM

from servegate.contracts.manifest import ServedModel
from servegate.contracts.quality_section import Suite
from servegate.gates.quality import divergence
from servegate.gates.quality.divergence import DivergenceProbe, teacher_forced_logits
from servegate.gates.suites.chat_items import item_request
from servegate.gates.suites.evaluation import ItemOutput, SuiteItem
from servegate.zoo.tokenizer import build_char_tokenizer


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two random tiny checkpoints with the zoo's character tokenizer."""
    return save_tiny_llama(tmp_path_factory.mktemp("a"), 0), save_tiny_llama(tmp_path_factory.mktemp("b"), 1)


def _served(path: Path) -> ServedModel:
    return ServedModel.model_validate({"name": "tiny", "weights": {"source": str(path)}})


ITEMS = [SuiteItem("1", "12+34=", ""), SuiteItem("2", "key=ABCD; the model key=", ""), SuiteItem("3", "a", "")]
OUTPUTS = [ItemOutput("1", "x", (5, 6, 7)), ItemOutput("2", "y", (8,)), ItemOutput("3", "z", (9, 10))]


def test_a_model_agrees_with_itself(checkpoints: tuple[Path, Path]) -> None:
    result = DivergenceProbe(_served(checkpoints[0]), _served(checkpoints[0])).measure(ITEMS, OUTPUTS)
    assert result.positions == 6  # one per continuation token
    assert result.token_agreement == 1.0 and result.mean_kl == pytest.approx(0.0, abs=1e-9)


def test_different_models_diverge(checkpoints: tuple[Path, Path]) -> None:
    result = DivergenceProbe(_served(checkpoints[0]), _served(checkpoints[1])).measure(ITEMS, OUTPUTS)
    assert result.mean_kl > 0.0 and result.max_kl >= result.mean_kl


def test_right_padding_in_a_batch_does_not_change_a_row(
    checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = LlamaForCausalLM.from_pretrained(checkpoints[0])
    tokenizer = build_char_tokenizer()
    prompts = [tokenizer(i.prompt)["input_ids"] for i in ITEMS]
    batched = teacher_forced_logits(model, tokenizer, prompts, [o.token_ids for o in OUTPUTS])
    alone = torch.cat(
        [teacher_forced_logits(model, tokenizer, [p], [o.token_ids]) for p, o in zip(prompts, OUTPUTS, strict=True)]
    )
    assert batched.shape == (6, len(tokenizer))
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(divergence, "LOGITS_BUDGET_BYTES", 1)  # one row per pass: the same logits
    torch.testing.assert_close(teacher_forced_logits(model, tokenizer, prompts, [o.token_ids for o in OUTPUTS]), alone)


def test_a_chat_items_continuation_is_forced_after_its_rendered_prompt(
    checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    (tmp_path / "chat.jinja").write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}>")
    served = ServedModel.model_validate(
        {"name": "tiny", "weights": {"source": str(checkpoints[0])},
         "preprocess": {"chat_template": str(tmp_path / "chat.jinja")},
         "postprocess": {"structured_output": {}}}
    )  # fmt: skip
    suite = Suite(name="x", dataset="x.jsonl", kind="extraction")
    request = item_request(served, suite, {"schema": '{"type": "object"}'}, "1", "12+34=", None)
    tokenizer = build_char_tokenizer()
    text, chat = divergence.prompt_ids(served, tokenizer, [ITEMS[0], SuiteItem("1", "12+34=", "{}", request)])
    assert text == tokenizer("12+34=")["input_ids"]
    assert chat == tokenizer("<user>12+34=>")["input_ids"]  # the answer followed the template's text
