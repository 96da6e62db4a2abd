"""The consolidator's operations port: `GET /healthz` and `GET /metrics` on `ENGRAM_METRICS_PORT`,
served in the worker's own event loop (a loop that stops turning stops answering).

`/healthz` answers 200 when every lane turned within `stall` seconds (`Settings.health_stall`; a lane
embedding a batch turns after each forward pass) and Redis answered a PING within `PING_TIMEOUT`; else
503 with `status` `starting`, `stuck`, `paused` (another embedder's index) or `redis unreachable`. The
JSON body always carries `checks` and the ages, e.g.::

    {"status": "ok", "checks": {"loop": true, "redis": true}, "consumer": "host-12-ab12cd",
     "lanes": 4, "loop_age_seconds": 0.4, "last_batch_age_seconds": 12.9, "processed": 812}

(`loop_age_seconds`: the least recently turned lane; `last_batch_age_seconds`: null before the first.)
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from shared.content_coding import identity_only

if TYPE_CHECKING:
    from services.consolidator.worker import Worker

PING_TIMEOUT = 2.0
"""Seconds a health probe waits for Redis's PING: a paused or overloaded Redis counts as unreachable."""


class Health:
    """What `/healthz` reports of one consolidator process. `worker` is set once the worker exists
    (before it, the process is loading its embedder). Times are `time.monotonic()` seconds."""

    def __init__(self, *, stall: float):
        self.stall = stall
        self.worker: Worker | None = None

    def report(self, redis_ok: bool) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) for the worker's state now and a PING result (see the module docstring)."""
        now = time.monotonic()
        w = self.worker
        beats = list(w.lane_beats.values()) if w is not None else []
        loop_age = round(now - min(beats), 3) if beats else None
        last_batch = round(now - w.last_batch_at, 3) if w is not None and w.last_batch_at else None
        loop_ok = loop_age is not None and loop_age <= self.stall
        if not beats:
            status = "starting"
        elif not redis_ok:
            status = "redis unreachable"
        elif not loop_ok:
            status = "stuck"
        elif w is not None and w.paused_by is not None:
            status = "paused"
        else:
            status = "ok"
        body: dict[str, Any] = {
            "status": status,
            "checks": {"loop": loop_ok, "redis": redis_ok},
            "consumer": w.name if w is not None else None,
            "lanes": len(beats),
            "loop_age_seconds": loop_age,
            "last_batch_age_seconds": last_batch,
            "processed": w.processed if w is not None else 0,
        }
        if status == "starting":
            body["pending"] = ["embedder"] if w is None else ["redis"]
        if status == "stuck":
            body["stall_seconds"] = self.stall
        return (200 if status == "ok" else 503), body

    async def ping(self) -> bool:
        """Whether the worker's Redis answers PING within PING_TIMEOUT (False before the worker exists)."""
        if self.worker is None:
            return False
        try:
            return bool(await asyncio.wait_for(self.worker.redis.ping(), PING_TIMEOUT))
        except Exception:  # any failure to reach Redis is "unreachable", never a 500
            return False


def operations_app(health: Health, registry: CollectorRegistry) -> web.Application:
    """The aiohttp app of the operations port: `/healthz` (see the module docstring), `/metrics`."""

    async def healthz(request: web.Request) -> web.Response:
        status, body = health.report(await health.ping())
        return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(middlewares=[identity_only])  # 415 for a Content-Encoding (shared.content_coding)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app


async def start_operations(
    health: Health, registry: CollectorRegistry, *, host: str, port: int
) -> web.AppRunner:
    """Serve `operations_app` on host:port; the runner (`cleanup()` stops it). OSError if the port is taken."""
    # aiohttp never decodes a body (shared.content_coding): a false gzip body logged a traceback per request
    runner = web.AppRunner(operations_app(health, registry), access_log=None, auto_decompress=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner
