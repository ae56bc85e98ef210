"""How long the reference runtime takes to load a GGUF: as transformers reads it, converted once, and kept.

Three ways, each in a fresh process (imports counted alike), interleaved round by round:
- `direct`: what a load did before the conversion was kept: the header read for the scheme, then transformers'
  GGUF reader for the model (config, every tensor dequantized) and again for the tokenizer;
- `first`: `load_causal_lm` of a `weights.format: gguf` manifest with an empty $SERVEGATE_HOME: it reads and
  dequantizes the file once and keeps the result (runtime/model/gguf_kept.py);
- `kept`: the same load again, reading what the `first` run kept.

    python benchmarks/gguf_load.py [--gguf FILE.gguf] [--rounds 3] [--cpus 0,1]

Without --gguf it loads the zoo's SmolLM2 Q4_1 file (`make fetch`). Prints each run's seconds (the load alone and
the process's wall time), then the medians with their spread and the direct/kept ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("direct", "first", "kept")


def load_once(mode: str, gguf: Path) -> float:
    """One load the way `mode` names (module notes); the seconds it took, imports excluded."""
    import torch  # noqa: F401  # imported before the clock starts, as every mode needs it
    import transformers  # noqa: F401

    from servegate.contracts.manifest import ServedModel
    from servegate.runtime.model.weights import load_causal_lm

    began = time.perf_counter()
    if mode == "direct":
        import gguf as gguf_package
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf_package.GGUFReader(gguf)  # the scheme's header read
        AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    else:
        served = ServedModel.model_validate(
            {"name": "m", "weights": {"source": str(gguf.parent), "format": "gguf", "gguf_file": gguf.name}}
        )
        load_causal_lm(served)
    return time.perf_counter() - began


def run(mode: str, gguf: Path, home: Path, cpus: str | None) -> tuple[float, float]:
    """`mode` in a fresh process with `home` as $SERVEGATE_HOME; (seconds of the load, wall seconds)."""
    command = [sys.executable, __file__, "--one", mode, "--gguf", str(gguf)]
    if cpus:
        command = ["taskset", "-c", cpus, *command]
    env = {**os.environ, "SERVEGATE_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-3000:])
        raise SystemExit(f"the {mode} load failed (exit {done.returncode})")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"]), wall


def _zoo_gguf() -> Path:
    from servegate.zoo import zoo_model_path

    found = sorted(Path(zoo_model_path("smollm2-135m-instruct")).glob("*.gguf"))
    if not found:
        raise SystemExit("the zoo's SmolLM2 has no GGUF beside it: gate zoo fetch smollm2-135m-instruct --force")
    return found[0]


def main() -> None:
    """Measure the three loads, interleaved, and print the medians and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, help="the GGUF file (default: the zoo's SmolLM2 Q4_1)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of direct, first, kept (default 3)")
    parser.add_argument("--cpus", help="pin every run to these cores (taskset), e.g. 0,1")
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    gguf = (args.gguf or _zoo_gguf()).resolve()
    if args.one:
        print(json.dumps({"seconds": load_once(args.one, gguf)}))
        return
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    print(f"file: {gguf} ({gguf.stat().st_size / 2**20:.1f} MiB)")
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="gguf-load-") as scratch:
            home = Path(scratch)  # empty: `first` converts, `kept` reads what it kept
            for mode in MODES:
                load, wall = run(mode, gguf, home, args.cpus)
                seconds[mode].append(load)
                print(f"round {i + 1} {mode:>6}: load {load:6.2f} s, process wall {wall:6.2f} s")
    print("medians (min-max):")
    for mode in MODES:
        runs = seconds[mode]
        print(f"  {mode:>6}: {statistics.median(runs):6.2f} s ({min(runs):.2f}-{max(runs):.2f})")
    ratio = statistics.median(seconds["direct"]) / statistics.median(seconds["kept"])
    print(f"direct/kept: {ratio:.1f}x; first/direct: "
          f"{statistics.median(seconds['first']) / statistics.median(seconds['direct']):.2f}x")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
