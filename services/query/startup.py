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
from collections.abc import Awaitable, Callable

from aiohttp import web

from services.query.problems import problem

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RETRY_AFTER_SECONDS = 2


class Startup:
    """What start-up still has to do (`pending`, in order) and the task doing it (None: not started,
    or run inline; make_app's cleanup cancels it). Times are `time.monotonic()` seconds."""

    def __init__(self) -> None:
        self.pending = ["embedder", "index"]
        self.task: asyncio.Task[None] | None = None
        self.started = time.monotonic()

    @property
    def ready(self) -> bool:
        return not self.pending

    def done(self, component: str) -> None:
        """Mark `component` loaded."""
        with contextlib.suppress(ValueError):
            self.pending.remove(component)

    async def wait(self) -> None:
        """Return once start-up succeeded (at once when it ran inline); re-raise its exception."""
        if self.task is not None:
            await asyncio.shield(self.task)


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
