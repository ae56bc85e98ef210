"""Run a coroutine to completion on a fresh event loop in a thread of its own, from synchronous code.

The endpoint engine's synchronous calls (`generate`, `score`) may be made from inside a running event loop
(a server, a notebook), where `asyncio.run` refuses to start: a thread with its own loop works either way.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def run_on_own_loop(make: Callable[[], Awaitable[T]]) -> T:
    """`await make()` on a new loop in a new thread; its result, or the exception it raised."""
    out: list[T] = []
    failed: list[BaseException] = []

    def target() -> None:
        async def go() -> T:
            return await make()

        try:
            out.append(asyncio.run(go()))
        except BaseException as exc:  # handed back to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]
