"""Capacity: how much load a served model holds, in four parts, each importing only the ones listed before it.

- `memory`: weight bytes and the memory budget (weights + runtime + KV per request).
- `bench`: workloads, the load generator and its targets, run metrics and their intervals, the own server.
- `latency`: the latency model, the simulator that turns it into request latencies for one batching policy,
  and `gate profile`, which measures this machine and fits the model (its last stage simulates traced runs).
- `planning`: `gate plan`'s search over batching policies and its report.
"""
