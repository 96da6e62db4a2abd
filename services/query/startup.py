"""The query service's start-up in the background (`make_app(..., background_start=True)`): the port
opens at once while loading the embedder and opening the index run in a task. Until both are done
`/readyz` answers 503 listing what is `pending`, the operations routes answer as usual, and every other
route answers 503 problem+json with `pending` and `Retry-After`. A start-up that fails fails the
process: `serve(..., watch=startup.wait)` re-raises it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from aiohttp import web

from services.query.problems import problem

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RETRY_AFTER_SECONDS = 2


class Startup:
    """What start-up still has to do (`pending`, in order) and the task doing it (None: not started,
    or run inline). Times are `time.monotonic()` seconds."""

    def __init__(self, pending: Iterable[str] = ("embedder", "index")):
        self.pending: list[str] = list(pending)
        self.task: asyncio.Task[None] | None = None
        self.started = time.monotonic()

    @property
    def ready(self) -> bool:
        return not self.pending

    def done(self, component: str) -> None:
        """Mark `component` loaded."""
        with contextlib.suppress(ValueError):
            self.pending.remove(component)

    def run(self, load: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start `load()` in the background (`wait` re-raises what it raises)."""
        self.task = asyncio.create_task(load(), name="query-startup")

    async def wait(self) -> None:
        """Return once start-up succeeded (at once when it ran inline); re-raise its exception."""
        if self.task is not None:
            await asyncio.shield(self.task)

    async def stop(self) -> None:
        """Cancel a start-up still in progress and wait for it (app cleanup)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


def startup_gate(startup: Startup, open_paths: frozenset[str]) -> Callable:
    """Middleware: until `startup` is ready, a route outside `open_paths` (route templates) answers
    503 problem+json naming what is pending, with Retry-After."""

    @web.middleware
    async def gate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if startup.ready:
            return await handler(request)
        resource = request.match_info.route.resource
        if resource is None or resource.canonical in open_paths:
            return await handler(request)
        return problem(
            503,
            f"the service is starting: waiting for {', '.join(startup.pending)} (see GET /readyz)",
            pending=list(startup.pending),
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )

    return gate
