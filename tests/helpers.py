"""Test helpers shared by every suite (no fixtures here; see conftest.py)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


async def wait_until(
    predicate: Callable[[], Any], *, timeout: float = 15.0, interval: float = 0.02, message: str = "condition"
) -> Any:
    """Poll `predicate` (sync or async) until it returns a truthy value; return that value.

    Raises AssertionError naming `message` (and the last value) after `timeout` seconds. This is the
    only place tests wait: they never sleep for a fixed time.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = predicate()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}; last value: {last!r}")
        await asyncio.sleep(interval)


def hit_id(hit: Any) -> str:
    """The episode id of a search hit returned with its `doc` field: the `episode_id` TAG field holds a
    digest (shared.tags), so ids are read from the stored document, as the service does."""
    import orjson

    return orjson.loads(hit.fields[b"doc"])["episode_id"]
