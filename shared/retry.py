"""Waiting out transient Redis faults: one backoff policy for every loop that retries.

redis-py already retries each command's transport errors (`shared.redis_conn`); these loops are the
ones above it: a process starting while Redis is down or loading, a worker lane that keeps consuming
through an outage, the SDK's publish deadline. They all take their delays from redis-py's own backoff
classes (`redis.backoff`), so the policy is written once.
"""

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
"""Redis faults that pass: Redis down, restarting, loading its AOF (BusyLoadingError is a
ConnectionError); on a Redis Cluster, a primary down or failing over. redis-py 8.1 raises
`ClusterDownError` ("The cluster is down": a node's cluster state is `fail` while a primary is
unreachable, `cluster-require-full-coverage yes`) and its subclass `MasterDownError`, `TryAgainError`
(a multi-key command during a resharding), `SlotNotCoveredError` (no node in the slot map covers the
slot) and `ClusterError("TTL exhausted.")` after its redirect and retry budget; it already retries
each of them a few times (`RedisCluster.cluster_error_retry_attempts`) before they reach us. Measured
on a 3-primary cluster: with one primary SIGSTOPped, a recall for a namespace on another
primary raised ClusterDownError. Neither a MovedError nor an AskError is here: redis-py follows them,
and one that reaches a caller (a cluster addressed as one Redis) is a configuration error."""

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
