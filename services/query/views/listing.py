"""`GET /v1/episodes` and `GET /v1/facts`: every episode or fact of a scope, page by page.

Pages are keysets (`shared.index_pages`): stable while others publish, no duplicates or gaps. The
cursor of the next page is opaque and signed (`services.query.cursors`); it is valid only with the same
filters and order it was issued for.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any, Literal

import orjson
from aiohttp import web
from pydantic import Field, PlainValidator, WithJsonSchema

from engram_episodic.shapes import response_shape
from engram_episodic.timeutil import parse_instant
from services.query import models
from services.query import recall as rc
from services.query.appkeys import CURSORS, KEYS
from services.query.cursors import filters_digest
from services.query.views.common import index_of, ns_of, redis_of, reply, store_of, tags_of
from shared.facts import Fact, FactQuery, live_facts_index
from shared.index import DOC_FIELD  # episodes and facts keep their JSON in one field name
from shared.index_pages import page
from shared.ties import TIE_FIELD

log = logging.getLogger("engram.query")

MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
_EPOCH = re.compile(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)", re.ASCII)


def _query_instant(value: Any) -> float:
    """An instant in a query string: ISO 8601 with an offset, or UTC epoch seconds as a decimal."""
    if isinstance(value, str) and len(value) <= 32 and _EPOCH.fullmatch(value):
        return parse_instant(float(value))
    return parse_instant(value)


QueryInstant = Annotated[
    float,
    PlainValidator(_query_instant),
    WithJsonSchema(
        {"type": "string", "description": "ISO 8601 with an offset (e.g. 2026-01-01T00:00:00Z) or epoch s"}
    ),
]
Kind = Literal["strategy", "failure_pattern", "best_practice", "preference"]  # shared.facts.KINDS


class _Page(models.Model):
    order: Literal["desc", "asc"] = Field(
        "desc", description="desc: newest first (default); asc: oldest first"
    )
    limit: Annotated[int, models.Bounded(1, MAX_LIMIT, from_query=True)] = Field(
        DEFAULT_LIMIT, description=f"results per page, 1..{MAX_LIMIT}"
    )
    cursor: str | None = Field(None, description="`next_cursor` of the previous page (same filters, order)")

    def filters(self) -> dict[str, Any]:
        return self.model_dump(exclude={"cursor", "limit"}, exclude_none=True)


class EpisodeListQuery(_Page, models.ScopeIn):
    """`GET /v1/episodes` query parameters: recall's scope filters, one value each."""

    category: models.TagList | None = None
    outcome: models.OutcomeList | None = None
    since: QueryInstant | None = Field(None, description="inclusive lower bound on completed_at")
    until: QueryInstant | None = Field(None, description="inclusive upper bound on completed_at")


class FactListQuery(_Page):
    """`GET /v1/facts` query parameters (facts are not kept per session: `session_id` is a 422)."""

    agent_id: models.IdStr | None = None
    user_id: models.IdStr | None = None
    category: models.IdStr | None = None
    kind: Kind | None = None
    episode_id: models.IdStr | None = Field(None, description="facts with this episode among their evidence")
    since: QueryInstant | None = Field(None, description="facts whose evidence ends at or after this")
    until: QueryInstant | None = Field(None, description="facts whose evidence starts at or before this")
    include_superseded: bool = False


async def _page(
    request: web.Request,
    route: str,
    q: _Page,
    index: str,
    query: str,
    sort_field: str,
    tie_field: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of `index`'s documents matching `query` (each one's stored JSON; one deleted since the
    page query is left out) and the next page's cursor (None on the last page)."""
    r, cursors = redis_of(request), request.app[CURSORS]
    filters = filters_digest(route, q.filters())
    after = await cursors.decode(r, q.cursor, q.order, filters) if q.cursor is not None else None
    rows, more = await page(
        r,
        index,
        query,
        sort_field=sort_field,
        descending=q.order == "desc",
        after=after,
        limit=q.limit,
        tie_field=tie_field,
    )
    nxt = await cursors.encode(r, q.order, filters, rows[-1].position) if more else None
    docs = []
    raws = await store_of(request).field([row.key for row in rows], DOC_FIELD)  # one pipeline
    for row, raw in zip(rows, raws, strict=True):
        if raw is None:
            continue
        try:
            docs.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            log.error("unreadable document ◆ key=%r", row.key[:80])
    return docs, nxt


def _answer(results: list[Any], q: _Page, nxt: str | None) -> web.Response:
    return reply({"results": results, "next_cursor": nxt, "order": q.order, "limit": q.limit})


async def list_episodes(request: web.Request, query: EpisodeListQuery) -> web.Response:
    """Every episode of a scope, newest first, page by page (opaque cursor)"""
    scope = rc.scope_of(ns_of(request), query, await tags_of(request))
    docs, nxt = await _page(
        request,
        "episodes",
        query,
        index_of(request),
        scope.query(),
        "completed_at",
        TIE_FIELD,
    )
    return _answer([response_shape(doc) for doc in docs], query, nxt)


async def list_facts(request: web.Request, query: FactListQuery) -> web.Response:
    """Every fact of a scope, newest first, page by page (opaque cursor)"""
    r, keys = redis_of(request), request.app[KEYS]
    fq = FactQuery(
        namespace=ns_of(request),
        tags=await tags_of(request),
        agent_id=query.agent_id,
        user_id=query.user_id,
        category=(query.category,) if query.category else (),
        kind=(query.kind,) if query.kind else (),
        evidence=(query.episode_id,) if query.episode_id else (),
        since=query.since,
        until=query.until,
        include_superseded=query.include_superseded,
    )
    index = await live_facts_index(r, keys)
    docs, nxt = await _page(request, "facts", query, index, fq.query(), "created_at")
    return _answer([Fact.from_data(doc).to_json() for doc in docs], query, nxt)
