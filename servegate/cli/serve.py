"""`gate serve`: serve a manifest over an OpenAI-compatible HTTP API."""

from __future__ import annotations

from typing import Annotated

import typer

from servegate.cli.common import ManifestArg, SetOption, load
from servegate.contracts.errors import ServegateError


def serve(
    manifest: ManifestArg,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
    sets: SetOption = None,
    grace_s: Annotated[
        float | None,
        typer.Option(
            "--grace-s", min=0, help="Seconds in-flight requests get after SIGTERM (default: request_timeout_s)."
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Serve MANIFEST as an OpenAI-compatible API: /v1/completions, /v1/chat/completions, /v1/embeddings.

    Also GET /v1/models, /health (alive), /ready (model loaded and warm-up passed), /metrics (Prometheus).
    SIGTERM drains: new requests get 503, in-flight ones finish within the grace period, exit 0.

    Examples:

        gate serve examples/quickstart/manifest.yaml

        gate serve manifest.yaml --port 9000 --set batching.mode=continuous
    """
    served = load(manifest, sets)
    if log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ServegateError(f"--log-level must be debug, info, warning or error (got {log_level!r})")
    try:
        from servegate.runtime import build
    except ImportError as exc:
        raise ServegateError(f"the runtime is not available: {exc}") from None
    from servegate.runtime.engine.step_trace import open_step_trace
    from servegate.server import create_app
    from servegate.server import serve as run_server

    engine = build(served, step_trace=open_step_trace())  # fails fast (exit 2) on a model that cannot be found
    grace = served.failure_policy.request_timeout_s if grace_s is None else grace_s
    run_server(
        create_app(served, engine, grace_s=grace), host=host, port=port, grace_s=grace, log_level=log_level.lower()
    )


def register(app: typer.Typer) -> None:
    """Add `gate serve` to the CLI."""
    app.command("serve")(serve)
