"""Semantic memory over HTTP: search facts, read one with its evidence, consolidate on demand.

`POST /v1/consolidate` runs a `Consolidator` (with the optional summarizer) in this process, under the
same per-scope lease as the workers. The facts of `POST /v1/context` come from the provider under
`FACTS` (`services.query.views.recall.facts_provider`).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import Field, PlainValidator, WithJsonSchema, model_validator

from engram_episodic.errors import NotFound
from engram_episodic.shapes import episode_to_dict
from engram_episodic.timeutil import format_instant
from services.consolidator.facts import Consolidator
from services.consolidator.summarizer import Summarizer
from services.query import models
from services.query import recall as rc
from services.query.appkeys import EMBEDDER, KEYS, METRICS, SETTINGS
from services.query.views.common import embed, episode_of, index_of, ns_of, redis_of, reply, tags_of
from shared.facts import KINDS, FactQuery, FactScope, get_fact, live_facts_index, search_facts
from shared.index import Scope as EpisodeScope
from shared.index import current_generation, filter_search

KindList = Annotated[
    tuple[str, ...],
    PlainValidator(models._tag_list(32, KINDS)),
    WithJsonSchema(models._one_or_list_schema({"type": "string", "enum": list(KINDS)})),
]


class FactsSearchRequest(models.ScopeIn):
    """`POST /v1/facts/search`: facts near `query` (or the most confident ones without it)."""

    query: models.QueryText | None = None
    category: models.TagList | None = None
    kind: KindList | None = None
    level: Literal["namespace", "agent_category"] | None = None
    since: models.Instant | None = Field(
        None, description="facts whose evidence ends at or after this instant"
    )
    until: models.Instant | None = Field(
        None, description="facts whose evidence starts at or before this instant"
    )
    as_of: models.Instant | None = Field(
        None, description="the facts valid at this instant (history included)"
    )
    top_k: models.TopK = 10
    include_superseded: bool = False
    min_confidence: Annotated[float, models.Bounded(0.0, 1.0)] | None = None
    min_similarity: Annotated[float, models.Bounded(-1.0, 1.0)] = Field(
        0.0,
        description="with a query: leave out facts whose cosine with it is below this (the default 0 "
        "drops the ones pointing away from it; -1 keeps every fact)",
    )

    @model_validator(mode="after")
    def _no_session(self) -> FactsSearchRequest:
        if self.session_id is not None:
            raise ValueError("session_id: facts are not kept per session")
        return self


class ConsolidateRequest(models.Model):
    """`POST /v1/consolidate`: the namespace scope, one (agent_id, category) scope, or all of them."""

    agent_id: models.IdStr | None = None
    category: models.IdStr | None = None
    all_scopes: bool = Field(True, description="with no agent_id: also every (agent, category) scope")

    @model_validator(mode="after")
    def _pair(self) -> ConsolidateRequest:
        if (self.agent_id is None) != (self.category is None):
            raise ValueError("agent_id: agent_id and category go together")
        return self


async def facts_search(request: web.Request, body: FactsSearchRequest) -> web.Response:
    """Search consolidated facts (semantic memory)"""
    r = redis_of(request)
    q = FactQuery(
        namespace=ns_of(request),
        tags=await tags_of(request),
        agent_id=body.agent_id,
        user_id=body.user_id,
        category=body.category or (),
        kind=body.kind or (),
        level=body.level,
        since=body.since,
        until=body.until,
        as_of=body.as_of,
        include_superseded=body.include_superseded,
        min_confidence=body.min_confidence,
    )
    vector = await embed(request, body.query) if body.query else None
    hits = await search_facts(
        r, await live_facts_index(r, request.app[KEYS]), q, vector=vector, top_k=body.top_k
    )
    # a nonsense query would get the top_k facts anyway, some with negative cosines
    hits = [h for h in hits if h.score is None or h.score >= body.min_similarity]
    results = [h.fact.to_json() | ({} if h.score is None else {"score": round(h.score, 6)}) for h in hits]
    out: dict[str, Any] = {"results": results}
    if body.as_of is not None:
        out["as_of"] = format_instant(body.as_of)
    return reply(out)


async def fact_detail(request: web.Request, fact_id: str) -> web.Response:
    """One fact with its evidence episodes and history"""
    r, keys, ns = redis_of(request), request.app[KEYS], ns_of(request)
    fact = await get_fact(r, keys, ns, fact_id)
    if fact is None:
        raise NotFound(f"no fact {fact_id[:80]!r} in this namespace")
    evidence = []
    if fact.evidence:
        _, hits = await filter_search(
            r,
            index_of(request),
            EpisodeScope(
                namespace=ns,
                tags=await tags_of(request),
                episode_id=fact.evidence,
                live_at=time.time(),  # an expired episode is not shown, though the fact still counts it until erased
            ),
            return_fields=("doc",),
            sort_by="completed_at",
            descending=False,
            limit=len(fact.evidence),
        )
        evidence = [
            episode_to_dict(episode_of(c), iso=True) for c in map(rc.decode_hit, hits) if c is not None
        ]
    history: list[dict[str, Any]] = []
    seen = {fact.fact_id}
    cursor = fact.supersedes
    while cursor and cursor not in seen and len(history) < 50:
        seen.add(cursor)
        older = await get_fact(r, keys, ns, cursor)
        if older is None:
            break
        history.append(older.to_json())
        cursor = older.supersedes
    return reply({"fact": fact.to_json(), "evidence": evidence, "history": history})


async def consolidate(request: web.Request, body: ConsolidateRequest) -> web.Response:
    """Consolidate the namespace's episodes into facts now"""
    r, s, embedder, ns = redis_of(request), request.app[SETTINGS], request.app[EMBEDDER], ns_of(request)
    summarizer = Summarizer.from_settings(s, failures_metric=request.app[METRICS].summarizer_failures)
    cons = Consolidator(s, r, embedder.dim, summarizer=summarizer, embedder=embedder)
    try:
        if body.agent_id is not None:
            scopes = [FactScope(ns, body.agent_id, body.category)]
        elif body.all_scopes:
            scopes = await cons.scopes_of(ns)
        else:
            scopes = [FactScope(ns)]
        results = [await cons.consolidate(scope) for scope in scopes]
    finally:  # a summarizer lives for one call
        if summarizer is not None:
            await summarizer.aclose()
    return reply(
        {
            "results": [x.to_json() for x in results],
            "summarizer_failures": sum(x.summarizer_failures for x in results),
            "generation": await current_generation(r, request.app[KEYS]),
        }
    )
