"""Regression: a keyword query whose union starts with two stop words crashed redisearch.so (SIGSEGV).

Found by the LoCoMo benchmark ("Is it likely that Nate has friends besides Joanna?"); `keyword_query`
now drops RediSearch's default stop words, so such a query reaches the server without them.
"""

from __future__ import annotations

import numpy as np

from engram_episodic.validation import parse_episode
from services.query.recall.arms import bm25_search
from shared.index import (
    Scope,
    VectorParams,
    ensure_episode_index,
    episode_fields,
    keyword_query,
)
from shared.keys import Keys
from shared.keywords import STOPWORDS
from shared.tags import BLAKE2B
from tests.helpers import hit_id


def test_keyword_query_drops_stop_words():
    q = keyword_query("Is it likely that Nate has friends besides Joanna?")
    assert q is not None
    terms = set(q.rsplit(":(", 1)[1].rstrip(")").split(" | "))
    assert terms == {"likely", "nate", "has", "friends", "besides", "joanna"}
    assert not terms & STOPWORDS
    assert keyword_query("is it the a") is None


async def test_stop_words_first_does_not_crash_redis(settings, redis):
    keys = Keys(settings.prefix)
    await ensure_episode_index(redis, keys, 1, VectorParams(dim=8, algorithm="FLAT"), "test", tag_key=None)
    ep = parse_episode(
        {"episode_id": "e1", "task": "Nate has friends", "outcome": "success", "completed_at": 1.0}
    )
    await redis.hset(
        keys.episode_doc(1, "ns", "e1"),
        mapping=episode_fields(
            "ns", ep, status="completed", vector=np.ones(8, dtype=np.float32), tags=BLAKE2B
        ),
    )
    hits = await bm25_search(
        redis,
        keys.episode_index_alias,
        Scope(tags=BLAKE2B, namespace="ns"),
        "Is it likely that Nate has friends besides Joanna?",
        10,
        return_fields=("doc",),
    )
    assert [hit_id(h) for h in hits] == ["e1"]
    assert await redis.ping()
