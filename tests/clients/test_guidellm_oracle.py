"""guidellm 0.8.1 as an independent oracle of `gate bench`: the same prompt file, the same constant rate, one server.

Both tools read one JSONL file (`prompt`, `output_tokens_count` per line: guidellm's `--data kind=json_file`,
`gate bench --prompts`), send it at 5 requests/s evenly spaced against one `gate serve`, interleaved
(gate bench, guidellm, gate bench, ...) so a drift of the shared machine moves both. Their medians must agree:

- TTFT: both to the first streamed token; servegate counts from the scheduled send (its dispatch delay is
  ~0.1 ms), guidellm from its actual send (its ~5 ms dispatch delay is left out).
- ITL: guidellm's `inter_token_latency_ms` is per request (last token - first token) / (output tokens - 1),
  which is servegate's TPOT; servegate's ITL (every gap between streamed chunks, pooled) is compared too.

The tolerances were measured before they were written down (benchmarks/README.md, "guidellm as an
oracle"): see TTFT_TOLERANCE and ITL_TOLERANCE.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clients_harness import GATE, MODEL, GateServe, client_bin, manifest

pytestmark = [pytest.mark.clients, pytest.mark.slow]

REQUESTS, RATE, PROMPT_CHARS, OUTPUT_TOKENS = 40, 5.0, 40, 16
RUNS = int(os.environ.get("SERVEGATE_ORACLE_RUNS", "3"))
"""Runs of each tool (more to measure the tolerances: SERVEGATE_ORACLE_RUNS=6)."""

TTFT_TOLERANCE = 0.8
"""|guidellm / gate bench - 1| of the TTFT medians. Measured 2026-12-01 on the shared 2-core VM (load average
4.3-10.5), interleaved runs of 40 requests at 5/s: 1.35 (21:59-22:04 UTC, 5 runs each), 1.30 (22:05-22:11 UTC,
6 runs each), 1.50 (22:13-22:15 UTC, 3 runs each), 1.28 (22:16-22:18 UTC) and 1.22 (22:19-22:21 UTC, 3 each).
guidellm is 2.0-3.8 ms over at a TTFT of 7.5-9.0 ms. In the second measurement the server's own TTFT (/metrics)
was the same during both tools' runs (5.7 ms): the gap is guidellm's client (httpx, its worker processes); in
the third it was 7.9-8.5 ms during guidellm's runs against 5.6-5.7 during gate bench's: on 2 cores guidellm's
own processes also slow the server. Both costs are additive and grow with the machine's load; 0.8 leaves room
for them, and the bracket in the test is the sharper check."""
ITL_TOLERANCE = 0.2
"""|guidellm / gate bench - 1| of the ITL medians (guidellm's per-request ITL against servegate's TPOT, and
against its pooled chunk gaps). Measured in the same runs: 1.07, 1.015, 1.07, 0.99, 0.96 (TPOT) and 1.10,
1.016, 1.09, 1.01, 0.96 (pooled), at 1.7-2 ms a token; a client's overhead cancels between two tokens of one
stream, hence the closer agreement."""


@pytest.fixture(scope="module")
def oracle_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateServe]:
    """`gate serve` over the zoo's tiny-primary, no tenants, unknown_fields: ignore (guidellm's stream_options)."""
    from servegate.zoo import ZooError, zoo_model_path

    client_bin("guidellm", "guidellm")  # skipped, naming `make clients-venvs`, before a server is started

    try:
        zoo_model_path("tiny-primary")
    except ZooError:
        pytest.skip("the zoo's tiny-primary is not built")
    data = manifest("zoo:tiny-primary", preprocess={"unknown_fields": "ignore"})
    server = GateServe(Path(tmp_path_factory.mktemp("gate-serve-oracle")), data)
    server.wait_ready()
    yield server
    assert server.stop() == 0


def write_prompts(path: Path, n: int = REQUESTS, seed: int = 0) -> Path:
    """n prompts of PROMPT_CHARS random lowercase words, each asking OUTPUT_TOKENS tokens, in guidellm's columns."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n):
            words = " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 7))) for _ in range(12))
            f.write(json.dumps({"prompt": words[:PROMPT_CHARS], "output_tokens_count": OUTPUT_TOKENS}) + "\n")
    return path


def _env(folder: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(folder / "hf")}


def gate_bench(url: str, prompts: Path, out: Path, tokenizer: Path) -> dict[str, float]:
    """One `gate bench --prompts` run at the constant rate: its TTFT, TPOT and ITL medians (ms)."""
    command = [str(GATE), "bench", "--url", f"{url}/v1", "--model", MODEL, "--prompts", str(prompts)]
    command += ["--rate", str(RATE), "--arrival", "constant", "--tokenizer", str(tokenizer), "--json", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, env=_env(out.parent), timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["requests"]["completed"] == REQUESTS
    assert report["workload_shape"]["achieved"], report["warnings"]
    return {
        "ttft": report["ttft_ms"]["p50"],
        "ttft_mean": report["ttft_ms"]["mean"],
        "itl": report["tpot_ms"]["p50"],
        "itl_pooled": report["itl_ms"]["p50"],
        "dispatch": report["dispatch_delay_ms"]["p50"],
    }


def guidellm(url: str, prompts: Path, out: Path, tokenizer: Path) -> dict[str, float]:
    """One guidellm run of the same file at the same constant rate: its TTFT and ITL medians (ms)."""
    backend = {"kind": "openai_http", "target": url, "model": MODEL, "request_format": "/v1/completions"}
    command = [str(client_bin("guidellm", "guidellm")), "run", "--backend", json.dumps(backend)]
    command += ["--data", f"kind=json_file,path={prompts}", "--tokenizer", f"kind=huggingface_auto,model={tokenizer}"]
    command += ["--profile", f"kind=constant,rate={RATE:g}", "--constraint", f"kind=max_requests,count={REQUESTS}"]
    command += ["--output", f"kind=json,path={out}"]
    run = subprocess.run(command, capture_output=True, text=True, env=_env(out.parent), timeout=600, cwd=out.parent)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    bench = json.loads(out.read_text())["benchmarks"][0]
    metrics = bench["metrics"]
    assert metrics["request_totals"]["successful"] == REQUESTS, metrics["request_totals"]
    sent = [json.loads(r["request_args"])["body"]["prompt"] for r in bench["requests"]["successful"]]
    asked = [json.loads(line)["prompt"] for line in prompts.read_text().splitlines()]
    assert sorted(sent) == sorted(asked)  # the same prompts as gate bench's, none made up
    return {
        "ttft": metrics["time_to_first_token_ms"]["successful"]["median"],
        "itl": metrics["inter_token_latency_ms"]["successful"]["median"],
        "dispatch": 1000.0 * metrics["request_dispatch_delay"]["successful"]["median"],
    }


def server_ttft(url: str) -> tuple[float, int]:
    """The server's own TTFT tally from /metrics (seconds summed, requests): a third witness, beside both clients."""
    import httpx

    total, count = 0.0, 0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("servegate_time_to_first_token_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("servegate_time_to_first_token_seconds_count"):
            count += int(float(line.rsplit(" ", 1)[1]))
    return total, count


def _server_mean_ms(before: tuple[float, int], after: tuple[float, int]) -> float:
    return 1000.0 * (after[0] - before[0]) / max(1, after[1] - before[1])


def compare(server: GateServe, folder: Path, runs: int = RUNS) -> dict[str, Any]:
    """`runs` runs of each tool, interleaved, on one prompt file: per-run medians and the guidellm/servegate ratios."""
    from servegate.zoo import zoo_model_path

    tokenizer = zoo_model_path("tiny-primary")
    prompts = write_prompts(folder / "prompts.jsonl")
    gate_runs: list[dict[str, float]] = []
    guide_runs: list[dict[str, float]] = []
    load = [os.getloadavg()[0]]
    began = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    for i in range(runs):
        for rows, tool in ((gate_runs, gate_bench), (guide_runs, guidellm)):
            before = server_ttft(server.base_url)
            rows.append(tool(server.base_url, prompts, folder / f"{tool.__name__}-{i}.json", tokenizer))
            rows[-1]["server_ttft_mean"] = _server_mean_ms(before, server_ttft(server.base_url))
        load.append(os.getloadavg()[0])

    def median(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    ratios = {key: median(guide_runs, key) / median(gate_runs, key) for key in ("ttft", "itl")}
    ratios["itl_pooled"] = median(guide_runs, "itl") / median(gate_runs, "itl_pooled")
    return {"began": began, "load": load, "gate": gate_runs, "guidellm": guide_runs, "ratios": ratios}


def _print(result: dict[str, Any]) -> None:
    print(f"\n{result['began']}; load average {', '.join(f'{x:.1f}' for x in result['load'])}", file=sys.stderr)
    for i, (g, h) in enumerate(zip(result["gate"], result["guidellm"], strict=True)):
        print(
            f"run {i}: gate bench TTFT {g['ttft']:.2f} TPOT {g['itl']:.3f} ITL {g['itl_pooled']:.3f} dispatch "
            f"{g['dispatch']:.3f} server TTFT mean {g['server_ttft_mean']:.2f} | guidellm TTFT {h['ttft']:.2f} "
            f"ITL {h['itl']:.3f} dispatch {h['dispatch']:.3f} server TTFT mean {h['server_ttft_mean']:.2f}",
            file=sys.stderr,
        )
    print("ratios guidellm/servegate: " + json.dumps(result["ratios"]), file=sys.stderr)


def test_guidellm_agrees_with_gate_bench_on_the_same_prompts(oracle_serve: GateServe, tmp_path: Path) -> None:
    result = compare(oracle_serve, tmp_path)
    _print(result)
    ratios = result["ratios"]
    assert abs(ratios["ttft"] - 1) <= TTFT_TOLERANCE, ratios
    # gate bench's TTFT lies between the server's own and guidellm's. Below: a client's TTFT holds the server's,
    # so its mean cannot be under the server's mean of the same requests (5% for the probe the server counts too).
    # Above: its client is the leaner one (benchmarks/README.md, "what gate bench adds to TTFT"), 10% for the machine.
    for run in result["gate"]:
        assert run["server_ttft_mean"] <= 1.05 * run["ttft_mean"], run
    ours = statistics.median(r["ttft"] for r in result["gate"])
    theirs = statistics.median(r["ttft"] for r in result["guidellm"])
    assert ours <= 1.1 * theirs, (ours, theirs)
    assert abs(ratios["itl"] - 1) <= ITL_TOLERANCE, ratios
    assert abs(ratios["itl_pooled"] - 1) <= ITL_TOLERANCE, ratios
