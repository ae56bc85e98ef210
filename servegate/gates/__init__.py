"""servegate.gates: release gates that compare a candidate served model with its baseline.

A gate is a `Gate` subclass registered with `@register_gate(name, watches=..., purpose=...)` (third
parties register through the `servegate.gates` entry-point group); its `run(ctx)` returns a
`GateResult`. `servegate.gates.check.check_manifest` / `run_check` plan and run them into a `GateReport`.
"""

from servegate.gates.base import Gate, GateContext
from servegate.gates.registry import GATES, register_gate
from servegate.gates.result import GateReport, GateResult

__all__ = ["GATES", "Gate", "GateContext", "GateReport", "GateResult", "register_gate"]
