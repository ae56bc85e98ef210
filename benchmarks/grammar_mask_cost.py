"""What the structured-output mask costs per decode step, at batch B on the real model (SmolLM2-135M-Instruct).

B chat prompts ask for JSON; every step runs the paged runner once over the batch, then picks each row's next
token twice on the same logits, in alternating order (A B, then B A): (A) unconstrained, as
`sample_batch` does, and (B) constrained, as `step_sampling` does: llguidance fills the B rows' masks,
`apply_mask` sets the disallowed logits to -inf, the row is sampled, and each matcher takes its token. The
sequences follow the constrained tokens; a row whose JSON is complete starts a fresh request (a new matcher,
its compile time reported on its own). The figure is the mask's extra time over the whole unconstrained step
(runner + A), per step: median and interquartile range. Needs `make fetch`.

    .venv/bin/python benchmarks/grammar_mask_cost.py [--batch 16] [--steps 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from importlib.metadata import version

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from servegate.contracts.constraint_fields import OutputConstraint
from servegate.runtime.model.grammar_mask import GrammarMask, apply_mask
from servegate.runtime.model.model_runner import PagedModelRunner
from servegate.runtime.model.sampling import sample_batch
from servegate.runtime.types import SamplingParams, SeqChunk
from servegate.zoo import zoo_model_path

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "skills": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "skills"],
}
TOPICS = ["a chef", "a pilot", "a farmer", "a poet", "a nurse", "a judge", "a diver", "a baker"]


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the architecture."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile)."""
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


def pick_masked(
    grammar: GrammarMask,
    matchers: list[object],
    logits: torch.Tensor,
    params: list[SamplingParams],
    fill_s: list[float],
) -> list[int]:
    """Each row's next token under its matcher's mask (greedy), the matchers advanced; the fill time appended."""
    began = time.perf_counter()
    allowed = grammar.allowed(matchers, logits.shape[-1])
    fill_s.append(time.perf_counter() - began)
    tokens, _ = sample_batch(apply_mask(logits, allowed), params, [None] * len(params))
    picked = tokens.tolist()
    for m, token in zip(matchers, picked, strict=True):
        grammar.advance(m, token)
    return picked


class XgrammarTwin:
    """xgrammar's matchers on the same constraint, fed the same tokens, their fills timed beside llguidance's
    (only when xgrammar is installed: it is not a dependency, it pulls in triton)."""

    def __init__(self, tokenizer: object, logits_width: int, batch: int, constraint: OutputConstraint) -> None:
        try:
            import xgrammar
        except ImportError:
            self.xgr = None
            return
        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=logits_width)
        compiler = xgrammar.GrammarCompiler(info)
        self.grammar = compiler.compile_json_schema(constraint.spec, any_whitespace=not constraint.compact)
        self.matchers = [xgrammar.GrammarMatcher(self.grammar) for _ in range(batch)]
        self.bitmask = xgrammar.allocate_token_bitmask(batch, logits_width)
        self.fill_s: list[float] = []

    def step(self, tokens: list[int]) -> None:
        """Time one fill of every row's mask, then feed each row its token."""
        if self.xgr is None:
            return
        began = time.perf_counter()
        for row, m in enumerate(self.matchers):
            m.fill_next_token_bitmask(self.bitmask, row)
        self.fill_s.append(time.perf_counter() - began)
        for m, token in zip(self.matchers, tokens, strict=True):
            m.accept_token(token)

    def restart(self, row: int) -> None:
        """A new request in the row."""
        if self.xgr is not None:
            self.matchers[row] = self.xgr.GrammarMatcher(self.grammar)

    def report(self, batch: int) -> None:
        """The two engines' fill per row, side by side."""
        if self.xgr is None:
            print("xgrammar not installed: no side-by-side fill")
            return
        q = quartiles(self.fill_s)
        print(f"xgrammar {version('xgrammar')} fill, same rows and tokens: median {q[1] * 1000:.2f} ms "
              f"(IQR {q[0] * 1000:.2f}-{q[2] * 1000:.2f}), per row {q[1] * 1000 / batch:.3f} ms")  # fmt: skip


def main() -> None:
    """Print the mask's share of a decode step at the given batch size."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--whitespace", default="compact", choices=["any", "compact"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = zoo_model_path("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    eos = sorted({tokenizer.eos_token_id, *([model.generation_config.eos_token_id] if isinstance(
        model.generation_config.eos_token_id, int) else model.generation_config.eos_token_id or [])})  # fmt: skip
    block = 16
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Describe {TOPICS[i % len(TOPICS)]} as JSON with name, age and skills."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(args.batch)
    ]
    longest = max(len(p) for p in prompts) + args.steps
    need = (longest + block - 1) // block
    runner = PagedModelRunner(model, num_blocks=need * args.batch, block_size=block)
    tables = [tuple(range(i * need, (i + 1) * need)) for i in range(args.batch)]

    t0 = time.perf_counter()
    grammar = GrammarMask(tokenizer, eos)
    tokenizer_s = time.perf_counter() - t0
    constraint = OutputConstraint("json_schema", json.dumps(SCHEMA), "guided_json", args.whitespace == "compact")
    compile_s: list[float] = []

    def fresh() -> object:
        began = time.perf_counter()
        matcher = grammar.matcher(constraint)
        compile_s.append(time.perf_counter() - began)
        return matcher

    matchers = [fresh() for _ in range(args.batch)]
    twin = XgrammarTwin(tokenizer, logits_width=model.config.vocab_size, batch=args.batch, constraint=constraint)
    params = [SamplingParams(max_tokens=args.steps)] * args.batch
    gens = [None] * args.batch
    with torch.inference_mode():
        logits = runner.execute([SeqChunk(i, tuple(p), 0, tables[i]) for i, p in enumerate(prompts)])
        positions = [len(p) for p in prompts]
        model_s, plain_s, masked_s, fill_s, ratios = [], [], [], [], []
        restarted = 0
        for step in range(args.steps):
            order = ("A", "B") if step % 2 == 0 else ("B", "A")
            picked: list[int] = []
            timed = {}
            for which in order:
                began = time.perf_counter()
                if which == "A":
                    sample_batch(logits, params, gens)
                else:
                    picked = pick_masked(grammar, matchers, logits, params, fill_s)
                timed[which] = time.perf_counter() - began
            plain_s.append(timed["A"])
            masked_s.append(timed["B"])
            twin.step(picked)
            for row, m in enumerate(matchers):
                if m.is_stopped():  # the JSON is complete: a new request takes the row
                    matchers[row] = fresh()
                    twin.restart(row)
                    restarted += 1
            began = time.perf_counter()
            chunks = [SeqChunk(i, (picked[i],), positions[i], tables[i]) for i in range(args.batch)]
            logits = runner.execute(chunks)
            model_s.append(time.perf_counter() - began)
            positions = [p + 1 for p in positions]
            ratios.append((timed["B"] - timed["A"]) / (model_s[-1] + timed["A"]))

    ms = 1000.0
    mq = quartiles(model_s)
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, {args.threads} torch threads; "
          f"SmolLM2-135M-Instruct float32, vocab {logits.shape[-1]}, batch {args.batch}, {args.steps} steps, "
          f"whitespace {args.whitespace}")  # fmt: skip
    print(
        f"llguidance tokenizer built once: {tokenizer_s * ms:.0f} ms; schema compiled per request: median "
        f"{statistics.median(compile_s) * ms:.2f} ms over {len(compile_s)} ({restarted} rows restarted)"
    )
    print(f"runner step            median {mq[1] * ms:7.2f} ms  (IQR {mq[0] * ms:.2f}-{mq[2] * ms:.2f})")
    for name, values in (
        ("pick, unconstrained (A)", plain_s),
        ("pick, masked (B)", masked_s),
        ("  of it: mask fill", fill_s),
    ):
        q = quartiles(values)
        print(f"{name:<23} median {q[1] * ms:7.2f} ms  (IQR {q[0] * ms:.2f}-{q[2] * ms:.2f})")
    fq = quartiles(fill_s)
    print(f"mask fill per row: median {fq[1] * ms / args.batch:.3f} ms")
    twin.report(args.batch)
    rq = quartiles(ratios)
    print(f"mask cost / unconstrained step: median {rq[1]:.1%} (IQR {rq[0]:.1%}-{rq[2]:.1%}); target at most 10%")


if __name__ == "__main__":
    main()
