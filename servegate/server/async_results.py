"""Asynchronous responses (`Prefer: respond-async`): run a request in the background, keep its result a while.

The result of a finished request is kept `postprocess.async_result_ttl_s` seconds, then forgotten (404).
Ids are unguessable, and a result is only shown to the tenant that sent the request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from servegate.contracts.errors import ServingError
from servegate.contracts.request_models import Endpoint


@dataclass
class AsyncJob:
    """One asynchronous request and, once it has finished, its HTTP status and body."""

    id: str
    endpoint: Endpoint
    tenant: str | None
    status_code: int | None = None
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    finished_at: float | None = None
    task: asyncio.Task[None] | None = None

    @property
    def done(self) -> bool:
        """Whether the result is in."""
        return self.finished_at is not None


Outcome = tuple[int, dict[str, Any], dict[str, str]]
"""(HTTP status, JSON body, headers) of a finished request."""


class AsyncResults:
    """The store of asynchronous requests: at most `max_pending` running, results kept `ttl_s` seconds."""

    def __init__(self, ttl_s: float, max_pending: int, retry_after_s: int, overload_status: int) -> None:
        self.ttl_s = ttl_s
        self.max_pending = max_pending
        self._retry_after_s = retry_after_s
        self._overload_status = overload_status
        self._jobs: dict[str, AsyncJob] = {}

    def pending(self) -> int:
        """Requests accepted but not finished."""
        return sum(1 for job in self._jobs.values() if not job.done)

    def submit(
        self, job_id: str, endpoint: Endpoint, tenant: str | None, run: Callable[[], Awaitable[Outcome]]
    ) -> AsyncJob:
        """Start `run` in the background under `job_id`; overloaded when max_pending requests are running."""
        self._sweep()
        if self.pending() >= self.max_pending:
            raise ServingError(
                "overloaded",
                status=self._overload_status,
                retry_after_s=self._retry_after_s,
                retry_after=self._retry_after_s,
            )
        job = AsyncJob(id=job_id, endpoint=endpoint, tenant=tenant)

        async def _run() -> None:
            try:
                job.status_code, job.body, job.headers = await run()
            finally:
                job.finished_at = time.monotonic()

        job.task = asyncio.get_running_loop().create_task(_run(), name=f"async-{job_id}")
        self._jobs[job_id] = job
        return job

    def get(self, job_id: str, tenant: str | None) -> AsyncJob | None:
        """The job, or None when unknown, expired, or sent by another tenant."""
        self._sweep()
        job = self._jobs.get(job_id)
        if job is None or job.tenant != tenant:
            return None
        return job

    def _sweep(self) -> None:
        now = time.monotonic()
        expired = [k for k, j in self._jobs.items() if j.finished_at is not None and now - j.finished_at >= self.ttl_s]
        for key in expired:
            del self._jobs[key]

    async def close(self) -> None:
        """Cancel what is still running (called at shutdown, after the grace period)."""
        tasks = [job.task for job in self._jobs.values() if job.task is not None and not job.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
