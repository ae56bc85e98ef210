"""Serve a manifest on the fault-injecting engine exactly as `gate serve` does (same app, same runner).

    python tests/support/serve_fault_engine.py MANIFEST PORT [BEHAVIOUR_JSON]

Used by the tests that must inject a fault the real engine cannot be asked for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))  # `support.` imports inside fault_engine

from fault_engine import FakeBehaviour, FaultEngine  # noqa: E402

from servegate.contracts.loading import load_manifest  # noqa: E402
from servegate.server import create_app, serve  # noqa: E402


def main() -> None:
    """Parse the arguments and serve until SIGTERM."""
    manifest, port = Path(sys.argv[1]), int(sys.argv[2])
    behaviour = FakeBehaviour(**json.loads(sys.argv[3])) if len(sys.argv) > 3 else FakeBehaviour()
    served = load_manifest(manifest, [])
    grace = served.failure_policy.request_timeout_s
    serve(create_app(served, FaultEngine(served, behaviour)), "127.0.0.1", port, grace)


if __name__ == "__main__":
    main()
