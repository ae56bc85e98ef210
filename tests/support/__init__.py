"""What tests in several folders share: fake engines, servers, ports, manifests and tiny models.

tests/ is on sys.path (pytest puts the folder of the root conftest.py there), so any test imports
`support.<module>`:

- `fault_engine`: an engine with injected faults (delays, crashes, hangs, wrong outputs) for server tests;
  `serve_fault_engine.py` serves it as `gate serve` would;
- `oracle_engine`: an engine that solves the zoo tasks, with gate faults to plant (tenant-blind caches,
  batch-dependent outputs), for the gate tests;
- `fake_remote`, `fake_deployment`: OpenAI-compatible HTTP endpoints standing in for a remote engine or a
  deployment under `gate verify`;
- `servers`: server processes on free ports (`gate serve`, the fault-engine server) and their logs;
- `manifests`: manifest factories, and writing manifests to disk;
- `models`: tiny random Llamas in memory or on disk.
"""
