"""A Redis that hangs (paused, wedged: the socket open, nothing answering) is a 503 within a bound.

redis-py alone waits `socket_timeout` per attempt and retries, and a request sends several commands one
after another: a request waited 10-160 s, and grew with the commands it sent. Here a request that has run
`PROBE_AFTER` seconds makes one shared probe `PING` Redis (a cluster: every primary); a probe unanswered
for `HANG` seconds marks Redis hung, and every request that has then run `BOUND` seconds is cut and
answered 503 with Retry-After (`problems._outage`), however many there are. A PING answered clears it.

A slow command on a Redis that still answers PING (a search on the Query Engine's worker threads) is
never cut here. A search that holds a single-threaded Redis for `HANG` seconds blocks its PING too and
is, from outside, a hung server: cut the same way (Redis itself finishes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from shared.retry import TRANSIENT

log = logging.getLogger("engram.query")

PROBE_AFTER = 1.0
"""Seconds a request runs before Redis is probed (a request served within it costs one timer)."""
HANG = 4.0
"""Seconds a probe PING may go unanswered before Redis counts as hung."""
BOUND = PROBE_AFTER + HANG
"""Seconds a request runs at most while Redis is hung (then 503 with Retry-After)."""
UNANSWERED: tuple[type[Exception], ...] = (*TRANSIENT, TimeoutError)
"""A probe that ends so got no answer: timed out, refused, dropped (an error reply is an answer)."""
PROBE_LIMIT = 30.0
"""Seconds one probe waits before it starts again on a new connection (one silently dropped never answers)."""


class RedisWatch:
    """Whether Redis answers, probed while requests run long; cuts requests past `bound` while it does not.

    `redis` is set once the app has a client (None: nothing is probed). Times are the loop's (seconds)."""

    def __init__(self, *, probe_after: float = PROBE_AFTER, hang: float = HANG):
        self.redis: aioredis.Redis | None = None
        self.probe_after, self.hang, self.bound = probe_after, hang, probe_after + hang
        self.hung = False
        self._running: dict[asyncio.Timeout, float] = {}  # each running request's deadline → its start
        self._probe: asyncio.Task[None] | None = None

    async def run(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """`await call()`, cut after `bound` seconds while Redis is hung: raises redis-py's TimeoutError
        then (a Redis fault, answered 503). Any other exception of `call` propagates as it is."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        timer = loop.call_later(self.probe_after, self._suspect)
        try:
            async with asyncio.timeout_at(started + self.bound if self.hung else None) as deadline:
                self._running[deadline] = started
                try:
                    return await call()
                finally:
                    del self._running[deadline]
        except TimeoutError:
            if not deadline.expired():
                raise  # the call's own
            raise RedisTimeout(f"Redis answered no PING for {self.hang:g}s (hung or blocked)") from None
        finally:
            timer.cancel()

    def _suspect(self) -> None:
        if self._probe is None and self.redis is not None:
            self._probe = asyncio.create_task(self._probing(self.redis), name="engram.query.redis-watch")

    def _overdue(self, now: float) -> bool:
        return any(now - started >= self.probe_after for started in self._running.values())

    async def _probing(self, redis: aioredis.Redis) -> None:
        """PING while Redis is hung or a request has run `probe_after` s; `_hang` once none was answered
        for `hang` s. Only an answer counts: a reply, or an error reply (a cluster's "CLUSTERDOWN")."""
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        try:
            while self.hung or self._overdue(loop.time()):
                timer = timer or loop.call_later(self.hang, self._hang)
                try:
                    await asyncio.wait_for(redis.ping(), PROBE_LIMIT)
                except ResponseError:
                    pass  # answered
                except UNANSWERED:  # timed out, refused: probe again, the clock running on
                    await asyncio.sleep(self.probe_after)
                    continue
                timer.cancel()
                timer = None
                self._responsive()
                await asyncio.sleep(self.probe_after)
        finally:
            if timer is not None:
                timer.cancel()
            self._probe = None

    def _hang(self) -> None:
        if not self.hung:
            log.warning("redis answered no PING for %gs ◆ cutting requests after %gs", self.hang, self.bound)
        self.hung = True
        now = asyncio.get_running_loop().time()
        for deadline, started in self._running.items():
            if not deadline.expired():
                deadline.reschedule(max(now, started + self.bound))

    def _responsive(self) -> None:
        if self.hung:
            log.info("redis answers again")
        self.hung = False
        for deadline in self._running:
            if not deadline.expired():
                deadline.reschedule(None)

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe


def watch_middleware(watch: RedisWatch) -> Callable:
    """Middleware: every request runs under `watch` (a hung Redis is a 503 within `watch.bound` s)."""

    @web.middleware
    async def watched(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
        return await watch.run(lambda: handler(request))

    return watched
