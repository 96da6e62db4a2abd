"""`/healthz`, `/readyz`, `/metrics`, `/openapi.json` (the document `make_app` installed under OPENAPI)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from services.query.appkeys import EMBEDDER, KEYS, METRICS, OPENAPI, REDIS, SETTINGS, STARTUP, TAGS
from services.query.views.common import index_of, reply
from shared import generations, streams
from shared.facts import facts_state
from shared.index import index_exists


async def healthz(request: web.Request) -> web.Response:
    """Liveness"""
    return reply({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: Redis, index and embedder"""
    checks: dict[str, bool] = {}
    r = request.app.get(REDIS)
    try:  # a probe answers within 2 s: a Redis that hangs (paused, overloaded) is "not ready" too
        checks["redis"] = bool(r is not None and await asyncio.wait_for(r.ping(), 2.0))
        checks["index"] = bool(
            r is not None and await asyncio.wait_for(index_exists(r, index_of(request)), 2.0)
        )
    except Exception:  # any failure to reach Redis means "not ready", never a 500
        checks.setdefault("redis", False)
        checks["index"] = False
    embedder = request.app.get(EMBEDDER)
    checks["embedder"] = embedder is not None and embedder.loaded
    startup = request.app[STARTUP]
    if not startup.ready:  # loading behind an open port (services.query.startup)
        # a component this process has not finished setting up is not ready, whatever Redis holds (else
        # the body reads `pending: ["index"]` beside `checks.index: true`)
        checks.update({c: False for c in startup.pending if c in checks})
        return reply({"status": "starting", "pending": list(startup.pending), "checks": checks}, status=503)
    body: dict[str, Any] = {"checks": checks}
    # what the consolidator left behind, told here too: informational, never a readiness failure
    body.update(await consolidation(request) if checks["redis"] else {"dead_letters": None, "lag": None})
    # rebuilt with another embedder under this process: every search would 409
    if checks["index"] and r is not None:
        try:
            mismatch = await asyncio.wait_for(request.app[TAGS].mismatch(r), 2.0)
        except Exception:
            mismatch, checks["index"] = None, False
        if mismatch is not None:
            checks["embedder"], body["why"] = False, str(mismatch)
        try:  # what the replay that built the live generation did with the facts; no check: recall needs none
            body["facts"] = await asyncio.wait_for(facts_state(r, request.app[KEYS]), 2.0)
            live, building = await asyncio.wait_for(generations.writable(r, request.app[KEYS]), 2.0)
            body["generations"] = {"live": live, "building": building}
        except Exception:  # noqa: BLE001 - informative only, never a 500 or "not ready"
            pass
    ok = all(checks.values())
    return reply({"status": "ready" if ok else "not ready", **body}, status=200 if ok else 503)


async def consolidation(request: web.Request) -> dict[str, int | None]:
    """`{"dead_letters": n, "lag": n}`: entries in the dead-letter stream (the consolidator gave up on
    them: `engram-admin dead-letters` says why) and entries published but not yet delivered to the consumer
    group, summed over the partitions; None each when Redis does not answer within 2 s."""
    r, keys, s = request.app.get(REDIS), request.app[KEYS], request.app[SETTINGS]
    if r is None:
        return {"dead_letters": None, "lag": None}
    try:
        dead, lag = await asyncio.wait_for(
            asyncio.gather(
                streams.length(r, keys.dead_letters),
                streams.Partitions(r, keys.streams, s.consumer_group).lag(),
            ),
            2.0,
        )
    except Exception:  # noqa: BLE001 - Redis away or slow: unknown, never a 500 of a probe
        return {"dead_letters": None, "lag": None}
    return {"dead_letters": dead, "lag": lag}


async def metrics(request: web.Request) -> web.Response:
    """Prometheus metrics (ENGRAM_METRICS_KEY when API keys are set)"""
    m, stream = request.app[METRICS], await consolidation(request)
    for gauge, value in ((m.dead_letters, stream["dead_letters"]), (m.lag, stream["lag"])):
        gauge.set(math.nan if value is None else value)  # NaN: Redis did not answer
    return web.Response(body=generate_latest(m.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi_json(request: web.Request) -> web.Response:
    """This OpenAPI 3.1 document"""
    return reply(request.app[OPENAPI]())
