"""Run an app on uvicorn with servegate's graceful shutdown.

On SIGTERM (or Ctrl-C) the server first drains: /ready and every new API request answer 503, while
requests in flight (streams and asynchronous requests included) run to their end for up to the grace
period; then uvicorn closes the sockets and the engine shuts down. The process exits 0. A second
signal stops at once.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from servegate.server.state import ServerState

log = logging.getLogger("servegate.server")


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM/SIGINT drains the app before exiting (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, state: ServerState, grace_s: float) -> None:
        super().__init__(config)
        self.state = state
        self.grace_s = grace_s
        self.drain_started: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First signal: start draining. A second one: exit now."""
        # The signal is deliberately not recorded in _captured_signals: uvicorn would re-raise it after
        # shutdown and the process would die by the signal instead of exiting 0.
        if self.drain_started is None and not self.should_exit:
            self.drain_started = time.monotonic()
            self.state.draining = True
            log.info(
                "%s: draining, %d request(s) in flight, grace %g s",
                signal.Signals(sig).name,
                self.state.busy(),
                self.grace_s,
            )
        else:
            self.should_exit = True
            self.force_exit = sig == signal.SIGINT

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's 10 Hz tick: stop once drained or the grace period is over."""
        if self.drain_started is not None and not self.should_exit:
            busy = self.state.busy()
            waited = time.monotonic() - self.drain_started
            if busy == 0 or waited >= self.grace_s:
                if busy:
                    log.warning("grace period of %g s over: stopping with %d request(s) unfinished", self.grace_s, busy)
                else:
                    log.info("drained in %.1f s", waited)
                self.should_exit = True
        return await super().on_tick(counter)


def configure_logging(level: str) -> None:
    """Log servegate's lines to stderr at `level` (request text and tenant ids are never logged)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
    logger = logging.getLogger("servegate")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


def serve(app: FastAPI, host: str, port: int, grace_s: float, log_level: str = "info") -> None:
    """Serve `app` until SIGTERM/SIGINT, then drain for up to grace_s seconds and return."""
    configure_logging(log_level)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        # Draining already waited for in-flight work; this only bounds closing idle keep-alive connections.
        timeout_graceful_shutdown=2,
        timeout_keep_alive=5,
        server_header=False,
        access_log=False,  # servegate.access logs each request by endpoint label, never its path or query
    )
    DrainingServer(config, app.state.serving, grace_s).run()
