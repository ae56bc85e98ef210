"""The resident memory of a server and every process it started, read once from /proc.

An engine servegate starts (vLLM) is several processes: servegate's server, vLLM's API server, its engine
core and its workers. A plan that counts the weights and the KV pool counts only part of what they hold
(the interpreters, torch, the engine's buffers), so `gate profile` reads the resident set of the whole
process tree after its sweeps, once, and the plan's memory model uses that figure (capacity/planning/
engine_memory.py). Pages two processes share are counted in each, as a budget for the whole group has to.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegate.contracts.units import format_bytes

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessRss:
    """One process of the group."""

    pid: int
    name: str
    """Its command name (/proc/PID/comm: vLLM names its processes, e.g. `VLLM::EngineCor`)."""
    rss_bytes: int


@dataclass(frozen=True)
class ProcessGroupMemory:
    """The resident memory of a server's process tree, read once."""

    processes: tuple[ProcessRss, ...]
    kv_pool_bytes: int
    """The KV pool the engine was started with when read (part of the figure)."""
    measured_at: str = ""

    @property
    def total_bytes(self) -> int:
        """The group's resident memory: the sum over its processes."""
        return sum(p.rss_bytes for p in self.processes)

    def describe(self) -> str:
        """The total and each process's part, in one line."""
        parts = ", ".join(f"{p.name} {format_bytes(p.rss_bytes)}" for p in self.processes)
        return f"{format_bytes(self.total_bytes)} over {len(self.processes)} processes ({parts})"

    def as_dict(self) -> dict[str, Any]:
        """JSON form, with the total."""
        return {
            "processes": [p.__dict__ for p in self.processes],
            "kv_pool_bytes": self.kv_pool_bytes,
            "measured_at": self.measured_at,
            "total_bytes": self.total_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessGroupMemory:
        """Inverse of as_dict."""
        return cls(
            tuple(ProcessRss(int(p["pid"]), str(p["name"]), int(p["rss_bytes"])) for p in data["processes"]),
            int(data["kv_pool_bytes"]),
            str(data.get("measured_at", "")),
        )


def _parent(pid: int) -> int | None:
    """The parent of `pid` (None when it is gone)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name, in parentheses, may hold spaces


def process_tree(root: int) -> list[int]:
    """`root` and every process descended from it, root first."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (parent := _parent(int(entry.name))) is not None:
            children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        tree.append(pid)
        todo += sorted(children.get(pid, []))
    return tree


def _rss(pid: int) -> ProcessRss | None:
    """The resident set of one process (VmRSS), None when it is gone or holds no memory (a kernel thread)."""
    try:
        status = (PROC / str(pid) / "status").read_text(encoding="utf-8")
        name = (PROC / str(pid) / "comm").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return ProcessRss(pid, name, int(line.split()[1]) * 1024)  # reported in kB
    return None


def measure_process_group(root: int, kv_pool_bytes: int) -> ProcessGroupMemory | None:
    """The resident memory of `root`'s process tree now; None where /proc cannot be read (not Linux) or the
    process is gone."""
    if not (PROC / str(root) / "status").is_file():
        return None
    processes = tuple(p for pid in process_tree(root) if (p := _rss(pid)) is not None)
    if not processes:
        return None
    return ProcessGroupMemory(processes, kv_pool_bytes, time.strftime("%Y-%m-%dT%H:%M:%S%z"))
