"""What the failure policy decides for a request: the catalogued error of an overload, a deadline, a failure."""

from __future__ import annotations

from typing import Literal

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.sections import FailurePolicy

Trigger = Literal["overload", "timeout", "error"]


def overloaded(policy: FailurePolicy) -> ServingError:
    """The `overloaded` error with the policy's status and Retry-After."""
    return ServingError(
        "overloaded",
        status=policy.overload_status,
        retry_after_s=policy.retry_after_s,
        retry_after=policy.retry_after_s,
    )


def deadline_exceeded(timeout_s: float) -> ServingError:
    """The `deadline_exceeded` error (504) naming the deadline."""
    return ServingError("deadline_exceeded", timeout_s=round(timeout_s, 3))


def unavailable(detail: str) -> ServingError:
    """The `model_unavailable` error (503)."""
    return ServingError("model_unavailable", detail=detail)


def feed_window(served: ServedModel) -> int:
    """How many requests a file-like caller keeps in flight: enough to fill batches, never past max_queue."""
    return max(1, min(served.failure_policy.max_queue, max(4, 2 * served.batching.max_batch_size)))
