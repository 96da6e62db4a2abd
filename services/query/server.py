"""The HTTP server around the app: aiohttp's connection handler with Engram's answers to what it cannot parse.

aiohttp answers a request it cannot parse before any middleware runs, from `RequestHandler.handle_error`:
a `text/plain` body quoting the offending bytes and an ERROR traceback holding the raw header line (an
API key when the bad byte sits in `Authorization`), with no hook for it (aio-libs/aiohttp#3287). So
`ProblemRequestHandler` answers a terse RFC 9457 problem instead, `AppRunner` (use it instead of
`aiohttp.web.AppRunner`) serves with it, `serve()` runs an app with it as `web.run_app` would, and
`RedactCredentials` (shared.logs) strips credentials from whatever aiohttp's loggers still write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import BadHttpMethod, BadStatusLine, HttpProcessingError, LineTooLong

from services.query.problems import problem, route_of
from shared.logs import RedactCredentials

log = logging.getLogger("engram.query")

AIOHTTP_LOGGERS = ("aiohttp.server", "aiohttp.access", "aiohttp.web", "aiohttp.internal")


def install_log_redaction() -> None:
    """Add `RedactCredentials` to aiohttp's loggers, once per process."""
    for name in AIOHTTP_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactCredentials) for f in logger.filters):
            logger.addFilter(RedactCredentials())


def _detail(exc: BaseException | None) -> str:
    # fixed texts: the parser's own messages quote the request's bytes (a key in Authorization)
    if isinstance(exc, LineTooLong):
        return "the request line or a header is longer than this server accepts"
    if isinstance(exc, BadHttpMethod | BadStatusLine):
        return "the request line is not HTTP/1.x"
    return "the request is not valid HTTP (a header name or value has a forbidden character, or the framing is wrong)"


class ProblemRequestHandler(web.RequestHandler):
    """aiohttp's connection handler, answering its own errors as problem+json that quote nothing."""

    __slots__ = ()

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """A problem response for a request aiohttp failed to parse (400) or to handle (500, 504)."""
        if isinstance(exc, HttpProcessingError):
            log.debug("unparseable request from %s ◆ %s", request.remote, type(exc).__name__)
            resp = problem(status, _detail(exc))
        elif status >= 500 and status != 504:
            log.error(
                "unhandled error outside the middlewares ◆ %s",
                type(exc).__name__ if exc else "-",
                exc_info=exc,
            )
            resp = problem(500, "an unexpected error occurred; it was logged")
        else:
            resp = problem(status, "the request could not be handled in time" if status == 504 else None)
        if request.writer.output_size > 0:  # as aiohttp: a response already began, the connection is broken
            raise ConnectionError(
                "Response is sent already, cannot send another response with the error message"
            )
        resp.force_close()
        return resp


class ProblemServer(web.Server):
    """`web.Server` whose connections are served by `ProblemRequestHandler`."""

    def __call__(self) -> web.RequestHandler:
        # aiohttp's Server.__call__ names RequestHandler itself; the keyword arguments are the same
        return ProblemRequestHandler(self, loop=self._loop, **self._kwargs)


PROBES = frozenset({"/healthz", "/readyz"})
"""Routes whose answers (a 500 aside) the access log writes at DEBUG (see RouteAccessLogger)."""


class RouteAccessLogger(AbstractAccessLogger):
    """The access log line of a request with its route's template instead of its path, and no query
    string: ids live in paths and queries, where erasure cannot reach a log. A request that matched no
    route is logged as `<no route>`. Format: `remote "METHOD /route/{template}" status bytes duration_ms`."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        route = "<no route>"
        if isinstance(request, web.Request):
            with suppress(AssertionError, AttributeError):  # answered before routing: no match info
                route = route_of(request)
        # probes (a supervisor, a load balancer, `make run` itself) poll every few hundred ms: at DEBUG
        log = self.logger.debug if route in PROBES and response.status != 500 else self.logger.info
        fields = {
            "remote": request.remote,
            "method": request.method,
            "route": route,
            "status": response.status,
            "bytes": response.body_length,
            "duration_ms": round(time * 1000, 1),
        }
        # the facts are fields of their own too, for ENGRAM_LOG_FORMAT=json (the text format drops them)
        log(
            '%(remote)s "%(method)s %(route)s" %(status)d %(bytes)d %(duration_ms).1fms', fields, extra=fields
        )


class AppRunner(web.AppRunner):
    """`web.AppRunner` serving with `ProblemRequestHandler`, and with credentials redacted from aiohttp's logs.
    Request bodies are never decoded by aiohttp (`auto_decompress=False`): a Content-Encoding is refused
    with 415 instead (`shared.content_coding`)."""

    def __init__(self, app: web.Application, **kwargs: Any):
        super().__init__(app, **{"auto_decompress": False, **kwargs})

    async def _make_server(self) -> web.Server:
        install_log_redaction()
        server = await super()._make_server()
        return ProblemServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            **server._kwargs,
        )


def _run(loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
    """Run `task` (serve's main) to its end: the first SIGINT / SIGTERM (aiohttp's GracefulExit) cancels
    its wait, so it drains and cleans up; later ones do not interrupt that (under `make run` a Ctrl-C is
    two: the terminal's SIGINT and the supervisor's SIGTERM; a hard stop stays SIGKILL). What the task
    raises propagates."""
    stopping = False
    while not task.done():
        try:
            loop.run_until_complete(task)
        except (web.GracefulExit, KeyboardInterrupt):
            if not stopping:  # a later signal must not cancel the cleanup the first one started
                stopping = True
                task.cancel()
        except asyncio.CancelledError:
            return


def serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    loop: asyncio.AbstractEventLoop,
    on_ready: Callable[[], None],
    watch: Callable[[], Awaitable[None]],
) -> None:
    """Serve `app` until SIGINT/SIGTERM, like `web.run_app` with its defaults, but with `AppRunner`;
    the requests in flight then finish (aiohttp's drain), and further signals do not interrupt that.

    `on_ready()` is called once the port listens. Startup errors (e.g. `Conflict` from the app's cleanup
    context) propagate to the caller, and so does whatever `await watch()` raises while serving (a
    start-up that runs behind the open port: `services.query.startup.Startup.wait`).
    """

    async def main() -> None:
        runner = AppRunner(
            app,
            handle_signals=True,
            keepalive_timeout=75.0,  # run_app's keep-alive
            access_log_class=RouteAccessLogger,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            on_ready()
            await watch()
            await asyncio.Event().wait()  # until a signal raises GracefulExit
        finally:
            await runner.cleanup()

    asyncio.set_event_loop(loop)
    task = loop.create_task(main())
    try:
        _run(loop, task)
    finally:
        try:
            rest = asyncio.all_tasks(loop)
            for other in rest:
                other.cancel()
            loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
