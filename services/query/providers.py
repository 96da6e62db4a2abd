"""The dependencies `make_app` injects into the views, built once per app: `facts_provider(keys)`, the
`FACTS` of `POST /v1/context`, and `consolidation(settings, metrics)`, the `CONSOLIDATE` of
`POST /v1/consolidate` (the query service's one use of the consolidator; `make_app(consolidate=...)`
takes another)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from services.consolidator.facts import Consolidator, RunResult
from services.consolidator.summarizer import Summarizer
from services.query.appkeys import Consolidate, FactsProvider
from services.query.metrics import Metrics
from shared.embedding import Embedder
from shared.facts import FactQuery, FactScope, live_facts_index, search_facts
from shared.index import Scope
from shared.keys import Keys
from shared.settings import Settings


def facts_provider(keys: Keys) -> FactsProvider:
    """The facts of `/v1/context`: current only, each text once."""

    async def provider(
        r: aioredis.Redis, scope: Scope, query_vector: np.ndarray, k: int
    ) -> list[dict[str, Any]]:
        q = FactQuery(
            namespace=scope.namespace,
            tags=scope.tags,
            agent_id=scope.agent_id,
            user_id=scope.user_id,
            category=scope.category,
        )
        # the namespace scope and an (agent, category) scope holding the same episodes give the same
        # fact twice (same text): read twice as deep, keep each text once (the better-scored), then cut
        hits = await search_facts(r, await live_facts_index(r, keys), q, vector=query_vector, top_k=2 * k)
        seen: set[str] = set()
        out = []
        for h in hits:
            # a fact pointing away from the task is no context for it (`/v1/facts/search`'s default)
            if h.fact.text in seen or (h.score is not None and h.score < 0.0):
                continue
            seen.add(h.fact.text)
            out.append(
                {
                    "fact_id": h.fact.fact_id,
                    "kind": h.fact.kind,
                    "text": h.fact.text,
                    "support": h.fact.support,
                    "success_rate": h.fact.success_rate,
                    "confidence": h.fact.confidence,
                    "score": round(h.score, 6) if h.score is not None else None,
                }
            )
        return out[:k]

    return provider


def consolidation(settings: Settings, metrics: Metrics) -> Consolidate:
    """Consolidate on demand: one (agent_id, category) scope, or the namespace scope and, with
    `all_scopes`, every (agent, category) scope of the namespace. A summarizer (when configured) lives
    for one call."""

    async def consolidate(
        r: aioredis.Redis,
        embedder: Embedder,
        namespace: str,
        agent_id: str | None,
        category: str | None,
        all_scopes: bool,
    ) -> Sequence[RunResult]:
        summarizer = Summarizer.from_settings(settings, failures_metric=metrics.summarizer_failures)
        cons = Consolidator(settings, r, embedder.dim, summarizer=summarizer, embedder=embedder)
        try:
            if agent_id is not None:
                scopes = [FactScope(namespace, agent_id, category)]
            elif all_scopes:
                scopes = await cons.scopes_of(namespace)
            else:
                scopes = [FactScope(namespace)]
            return [await cons.consolidate(s) for s in scopes]
        finally:
            if summarizer is not None:
                await summarizer.aclose()

    return consolidate
