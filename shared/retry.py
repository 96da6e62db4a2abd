"""Waiting out transient Redis faults: one backoff policy (redis-py's `redis.backoff`) for every loop
that retries above redis-py's own per-command retries: a process starting while Redis is down, a
worker lane consuming through an outage, the SDK's publish deadline."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis import exceptions as redis_errors
from redis.backoff import AbstractBackoff, ExponentialBackoff

T = TypeVar("T")

REDIS_FAULTS: tuple[type[Exception], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ClusterError,
    redis_errors.TryAgainError,
    redis_errors.SlotNotCoveredError,
)
"""Redis faults that pass: Redis down, restarting, loading (BusyLoadingError is a
ConnectionError); on a cluster a primary down or failing over (ClusterDownError, MasterDownError,
TryAgainError, SlotNotCoveredError, ClusterError "TTL exhausted."), each already retried by redis-py.
Not MovedError or AskError: one that reaches a caller means a cluster addressed as one Redis."""

TRANSIENT: tuple[type[Exception], ...] = (*REDIS_FAULTS, OSError)
"""Faults a retrying loop waits out: `REDIS_FAULTS` and the OS's socket errors."""


class Backoff:
    """Delays (seconds) for consecutive failures from a redis-py backoff policy; `reset()` after a
    success. The default doubles from 0.1 s up to 5 s (`ExponentialBackoff(cap=5, base=0.05)`)."""

    def __init__(self, policy: AbstractBackoff | None = None):
        self.policy = policy or ExponentialBackoff(cap=5.0, base=0.05)
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return self.policy.compute(self.failures)

    def reset(self) -> None:
        self.failures = 0


async def wait_or_stop(stop: asyncio.Event | None, seconds: float) -> bool:
    """Sleep `seconds`, or less if `stop` is set meanwhile; True when stopped."""
    if stop is None:
        await asyncio.sleep(seconds)
        return False
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def until_available(
    op: Callable[[], Awaitable[T]],
    *,
    what: str,
    log: logging.Logger,
    stop: asyncio.Event | None = None,
    backoff: Backoff | None = None,
) -> T | None:
    """`await op()` until it raises no TRANSIENT fault, logging one warning per retry ("redis unavailable
    at <what>", e.g. `what="start of worker w1"`); returns its result, or None when `stop` is set first.
    Other exceptions propagate."""
    backoff = backoff or Backoff()
    while True:
        try:
            return await op()
        except TRANSIENT as exc:
            delay = backoff.next()
            log.warning("redis unavailable at %s (%s); retrying in %.1fs", what, type(exc).__name__, delay)
            if stop is not None and stop.is_set() or await wait_or_stop(stop, delay):
                return None
