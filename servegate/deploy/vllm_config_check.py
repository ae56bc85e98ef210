"""Check an exported vLLM config: with vLLM's own argument parser where vLLM is installed, else against the
option list of vLLM 0.32 kept as data (vllm_engine_args.json, with a note of where it came from)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

_KNOWN = Path(__file__).with_name("vllm_engine_args.json")

# Runs inside vLLM's interpreter: the parser `vllm serve` builds, fed the file the way `--config` feeds it.
_PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
import vllm
parser = make_arg_parser(FlexibleArgumentParser())
args = parser.parse_args(["--config", sys.argv[1]])
print(json.dumps({"vllm_version": vllm.__version__, "model": args.model}))
"""


@dataclass(frozen=True)
class ConfigCheck:
    """The outcome of checking one config.yaml."""

    method: str
    """`vllm-parser` (vLLM itself parsed it) or `known-keys` (checked against the option list as data)."""
    vllm_version: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when nothing was wrong."""
        return not self.problems


@lru_cache(maxsize=1)
def known_options() -> dict[str, Any]:
    """vLLM 0.32's option list: {"vllm_version", "quantization_methods", "options": {name: {kind, choices}}}."""
    return json.loads(_KNOWN.read_text(encoding="utf-8"))


def check_against_known_keys(config: dict[str, Any]) -> ConfigCheck:
    """Every key a vLLM option, every value of the right kind and among its choices."""
    known = known_options()
    options: dict[str, Any] = known["options"]
    problems: list[str] = []
    for key in sorted(config):
        value = config[key]
        spec = options.get(key)
        if spec is None:
            problems.append(f"{key}: not an option of vLLM {known['vllm_version']}")
            continue
        if spec["kind"] == "bool":
            if not isinstance(value, bool):
                problems.append(f"{key}: takes true or false (got {value!r})")
            elif value is False and not spec["negatable"]:
                problems.append(f"{key}: false is dropped by vLLM's --config loader (no --no-{key})")
            continue
        if isinstance(value, (dict, list)) and spec["kind"] != "list":
            if key not in ("compilation-config", "speculative-config", "hf-overrides", "override-generation-config"):
                problems.append(f"{key}: takes one value (got {type(value).__name__})")
        choices = spec.get("choices")
        if choices is not None and str(value) not in choices:
            problems.append(f"{key}: {value!r} is not one of {', '.join(choices)}")
        if key == "quantization" and value not in known["quantization_methods"]:
            problems.append(f"quantization: {value!r} is not a vLLM quantization method")
    return ConfigCheck("known-keys", known["vllm_version"], tuple(problems))


def vllm_python(root: Path | None = None) -> Path | None:
    """The interpreter of an installed vLLM: $SERVEGATE_VLLM_PYTHON, else .venvs/vllm under `root` (or cwd)."""
    configured = os.environ.get("SERVEGATE_VLLM_PYTHON")
    if configured:
        path = Path(configured)
        return path if path.is_file() else None
    candidate = (root or Path.cwd()) / ".venvs" / "vllm" / "bin" / "python"
    return candidate if candidate.is_file() else None


def check_with_vllm(config_path: Path, python: Path, timeout_s: float = 180.0) -> ConfigCheck:
    """Parse the file with vLLM's own `vllm serve` parser in vLLM's interpreter (types, choices, unknown keys)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1"}
    try:
        proc = subprocess.run(
            [str(python), "-c", _PARSE, str(config_path)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ConfigCheck("vllm-parser", "?", (f"vLLM's parser did not answer within {timeout_s:.0f} s",))
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        return ConfigCheck("vllm-parser", "?", (lines[-1] if lines else f"exit {proc.returncode}",))
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return ConfigCheck("vllm-parser", str(data["vllm_version"]), ())


def check_vllm_config(config_path: Path, root: Path | None = None) -> ConfigCheck:
    """vLLM's parser where vLLM is installed (see vllm_python), the known-keys check otherwise; both must agree."""
    import yaml

    config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    keys = check_against_known_keys(config)
    python = vllm_python(root)
    if python is None or not keys.ok:
        return keys
    return check_with_vllm(config_path, python)
