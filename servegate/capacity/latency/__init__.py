"""The latency model, the simulator that predicts one policy with it, and `gate profile`, which fits it.

Modules, each importing only those listed before it: `terms` (step cost, serving overheads, jitter),
`provenance` (what was profiled where, fit quality, profile files), `model` (LatencyModel and its JSON),
`step_fit` (least-squares fits of the step cost), `simulate`, `prediction`, `serving_trace`,
`load_fit`, `speed_check`, `step_timing`, `calibration`, and `profile` (the five stages in order).
docs/latency-model.md gives every term, its formula, and the stage and data that fit it.
"""
