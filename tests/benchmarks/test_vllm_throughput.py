"""benchmarks/vllm_throughput.py: the saved model folder both engines load, and a real --quick run against vLLM."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servegate.runtime.remote.vllm_process import VLLM_PYTHON_ENV, find_vllm_python

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO_ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))


def test_saved_folder_loads_back_with_a_tokenizer_of_the_model_vocab(tmp_path: Path) -> None:
    """The folder has the model's weights and a tokenizer with exactly its vocab, one id per character; the model
    never picks a special id greedily."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm_throughput import bench_model, save_model_folder

    model = bench_model(True, torch.float32)
    folder = save_model_folder(model, tmp_path / "model")
    assert (folder / "model.safetensors").is_file()
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert len(tok) == model.config.vocab_size == 512
    ids = tok("ab 12")["input_ids"]
    assert ids[0] == tok.bos_token_id == 1 and len(ids) == 6
    assert tok.decode(ids[1:]) == "ab 12"
    assert tok.decode([511]) == "<t511>"
    loaded = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    probe = torch.tensor([ids])
    with torch.inference_mode():
        logits = loaded(probe).logits
        assert torch.equal(logits, model(probe).logits)
    # the special ids' logits are 0 and never the greedy choice: every output token decodes to visible text
    assert (logits[..., :4] == 0).all() and int(logits.argmax(-1).min()) >= 4


def test_ratio_line_gives_the_ratio_of_medians_and_the_per_round_range() -> None:
    """servegate/vLLM is median over median; the range comes from the rounds paired in order."""
    from vllm_throughput import ratio_line, spread

    line = ratio_line("x", [100.0, 120.0, 80.0], [200.0, 100.0, 160.0])
    assert line == "x: servegate/vLLM 0.62x (per round 0.50-1.20x)"
    assert spread([3.0, 1.0, 2.0]) == "    2.0 (1.0-3.0)"


@pytest.mark.slow
def test_quick_run_against_vllm_prints_both_systems_and_their_ratios() -> None:
    """`--quick` runs servegate and vLLM offline and served, and prints each run and the ratios."""
    python = find_vllm_python(REPO_ROOT)
    if python is None:
        pytest.skip(f"no vLLM interpreter: run `make vllm-venv` (or set {VLLM_PYTHON_ENV})")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "vllm_throughput.py"), "--quick", "--vllm-python", str(python)],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for expected in ("round 1 servegate", "round 1 vllm", "offline float32 output tokens/s: servegate/vLLM"):
        assert expected in out, out
    assert "served float32" in out and "req/s output tokens/s: servegate/vLLM" in out, out
    assert "req/s TPOT p50: servegate/vLLM" in out and re.search(r"\| TPOT p50 +\d+\.\d ms \|", out), out
    failed = re.findall(r"\| failed (\d+) \|", out)
    assert failed and set(failed) == {"0"}, out
