"""The facts provider `make_app` injects into the views, built once per app: `facts_provider(keys)`, the
`FACTS` of `POST /v1/context` (`make_app(facts=...)` takes another)."""

from __future__ import annotations

from typing import Any

import numpy as np
import redis.asyncio as aioredis

from services.query.answers import FactBrief
from services.query.appkeys import FactsProvider
from shared.facts import FactQuery, live_facts_index, search_facts
from shared.index import Scope
from shared.keys import Keys


def facts_provider(keys: Keys) -> FactsProvider:
    """The facts of `/v1/context`: current only, each text once, each the fields of `answers.FactBrief`."""

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
            brief = {name: getattr(h.fact, name) for name in FactBrief.model_fields if name != "score"}
            out.append(brief | {"score": round(h.score, 6) if h.score is not None else None})
        return out[:k]

    return provider
