"""Replay recorded latencies through MLPerf LoadGen (SingleStream) and print its early-stopping figures as JSON.

Run with the LoadGen venv's Python (`make loadgen-venv`), never servegate's: it needs only mlperf_loadgen.
    .venvs/loadgen/bin/python tests/capacity/loadgen_replay.py latencies.json OUTDIR
latencies.json: {"latencies_ms": [...], "percentile": 0.9}. The i-th query LoadGen issues is answered
after the i-th recorded latency, so LoadGen measures (nearly) the recorded latencies itself.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time

import mlperf_loadgen as lg


def main(path: str, outdir: str) -> None:
    spec = json.loads(open(path, encoding="utf-8").read())
    latencies = [float(x) / 1000 for x in spec["latencies_ms"]]
    issued = [0]
    late: list[float] = []  # how much later than asked each answer went out: LoadGen's timer sees it too

    def issue(samples: list) -> None:
        for sample in samples:
            delay = latencies[issued[0] % len(latencies)]
            issued[0] += 1

            def answer(sample_id: int = sample.id, due: float = time.perf_counter() + delay) -> None:
                while time.perf_counter() < due:  # spin the last stretch: sleep wakes late
                    time.sleep(max(0.0, due - time.perf_counter() - 0.0005))
                lg.QuerySamplesComplete([lg.QuerySampleResponse(sample_id, 0, 0)])
                late.append(time.perf_counter() - due)

            threading.Thread(target=answer).start()

    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.SingleStream
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_query_count = settings.max_query_count = len(latencies)
    settings.min_duration_ms = 0
    settings.single_stream_expected_latency_ns = int(1e9 * sorted(latencies)[len(latencies) // 2])
    settings.single_stream_target_latency_percentile = float(spec["percentile"])
    log = lg.LogSettings()
    log.log_output.outdir = outdir
    log.log_output.copy_summary_to_stdout = False
    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(len(latencies), len(latencies), lambda s: None, lambda s: None)
    lg.StartTestWithLogSettings(sut, qsl, settings, log)
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)
    summary = open(f"{outdir}/mlperf_log_summary.txt", encoding="utf-8").read()
    estimates = {m[0]: int(m[1]) for m in re.findall(r"Early stopping (\d+\.\d)th percentile estimate: (\d+)", summary)}
    discard = re.search(r"Would discard (\d+) highest latency queries", summary)
    print(json.dumps({
        "queries": issued[0],
        "max_late_ms": 1000 * max(late, default=0.0),
        "estimates_ns": estimates,
        "discarded": int(discard.group(1)) if discard else None,
        "not_enough": "Not enough queries processed" in summary or "Only processed" in summary,
        "summary": summary,
    }))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
