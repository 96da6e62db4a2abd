"""`GET /v1/summary`: what the caller's namespace holds, counted by the index rather than read
episode by episode (the console's overview; one call at any size): episodes, distinct agents, users
and sessions, facts, and the episodes expiring soonest."""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from engram_episodic.timeutil import format_instant
from services.query.appkeys import KEYS
from services.query.store import distinct
from services.query.views.common import index_of, ns_of, redis_of, reply, tags_of
from shared.cluster import unless_missing
from shared.facts import FactQuery, live_facts_index
from shared.index import Scope, filter_search, index_size, numeric_clause

EXPIRING = 10  # the soonest expiring episodes listed


async def summary(request: web.Request) -> web.Response:
    """What the namespace holds: episodes, agents, users, sessions, facts, what expires soonest"""
    r, index, ns = redis_of(request), index_of(request), ns_of(request)
    tags = await tags_of(request)
    now = time.time()
    scope = Scope(namespace=ns, tags=tags, live_at=now)
    query = scope.query()
    total, _ = await filter_search(r, index, scope, return_fields=(), limit=0)
    agents, users, sessions = [
        await distinct(r, index, query, f) for f in ("agent_id", "user_id", "session_id")
    ]
    soon = Scope(namespace=ns, tags=tags, live_at=now, clause=numeric_clause("expires_at", now, None))
    _, hits = await filter_search(
        r, index, soon, return_fields=("doc",), sort_by="expires_at", descending=False, limit=EXPIRING
    )
    expiring = []
    for hit in hits:
        doc = orjson.loads(hit.fields[b"doc"]) if b"doc" in hit.fields else None
        if doc and doc.get("expires_at") is not None:
            expiring.append(
                {"episode_id": doc["episode_id"], "expires_at": format_instant(doc["expires_at"])}
            )
    facts_index = await live_facts_index(r, request.app[KEYS])
    # no facts index yet in the live generation: no facts
    facts = await unless_missing(index_size(r, facts_index, FactQuery(namespace=ns, tags=tags).query())) or 0
    return reply(
        {
            "episodes": total,
            "agents": agents,
            "users": users,
            "sessions": sessions,
            "facts": facts,
            "expiring": expiring,
        }
    )
