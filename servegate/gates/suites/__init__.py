"""Eval suites: loading a manifest's JSONL suites (chat items included), running them on an engine, scoring every
item with the zoo's metrics, and the on-disk cache of baseline outputs."""
