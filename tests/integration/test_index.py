"""The schema and query builder against the real RediSearch: exact TAG matches for hostile ids."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram_episodic.errors import Conflict
from engram_episodic.events import Episode, Feedback, Task
from engram_episodic.validation import Collector, check_id
from services.query.recall.arms import bm25_search, knn_search
from shared.index import (
    SORTABLE_TAG_FIELDS,
    STATUS_COMPLETED,
    TEXT_FIELDS,
    Scope,
    VectorParams,
    count,
    ensure_episode_index,
    episode_fields,
    escape_tag,
    filter_search,
    index_exists,
    index_size,
)
from shared.keys import Keys
from shared.tags import BLAKE2B
from tests.helpers import hit_id

C12_IDS = [
    "f2c59d63-a7a7-b5e6-8000-000000000000",
    "jira-summary",
    "a.b@c.d",
    "ns:with:colons",
    "path/with\\slash",
    "main",
    "_",
    "x|y",
    "{curly}",
    "$dollar",
    "日本語",
    "emoji-🙂",
    "@namespace:{x}",
    "a b",
    "-neg",
    "(paren)",
    "=>x",
    "*",
    "x*",
    "a,b",
    "User-A",
    "user-a",
    "ma",
]

DIM = 8


def unit(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i % DIM] = 1.0
    v[(i + 1) % DIM] = 0.1
    return v / np.linalg.norm(v)


async def make_index(redis, prefix):
    keys = Keys(prefix)
    await ensure_episode_index(redis, keys, 1, VectorParams(dim=DIM, algorithm="FLAT"), "test", tag_key=None)
    return keys


async def put(redis, keys, ns, ep, vec):
    await redis.hset(
        keys.episode_doc(1, ns, ep.episode_id),
        mapping=episode_fields(ns, ep, status=STATUS_COMPLETED, vector=vec, tags=BLAKE2B),
    )


async def test_ids_with_query_syntax_match_exactly(redis, prefix):
    """Case C12: ids holding query syntax, separators or non-ASCII text match exactly in the index."""
    keys = await make_index(redis, prefix)
    for i, value in enumerate(C12_IDS):
        ep = Episode(
            episode_id=value,
            agent_id=value,
            user_id=value,
            session_id=value,
            task=Task(description=f"task {i}", category=value),
            strategy_used=value,
            outcome="success",
            completed_at=1000.0 + i,
        )
        await put(redis, keys, value, ep, unit(i))
    for value in C12_IDS:
        for name in ("agent_id", "user_id", "session_id"):
            scope = Scope(tags=BLAKE2B, namespace=value, **{name: value})
            total, hits = await filter_search(redis, keys.episode_index_alias, scope, return_fields=("doc",))
            assert total == 1 and hit_id(hits[0]) == value, (name, value)
        scope = Scope(
            tags=BLAKE2B, namespace=value, category=(value,), strategy=(value,), episode_id=(value,)
        )
        hits = await knn_search(redis, keys.episode_index_alias, scope, unit(0), 5, return_fields=("doc",))
        assert [hit_id(h) for h in hits] == [value]


def _admitted(value: str) -> bool:
    """An id every route takes (`check_id`): DEL and the C1 controls are refused before a query is built."""
    errs = Collector()
    check_id(value, "id", errs, required=True)
    return not errs.errors


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.text(min_size=1, max_size=12).filter(_admitted))
async def test_escape_property_never_breaks_or_widens(redis, prefix, value):
    keys = Keys(prefix)
    if not await redis.hget(keys.meta, "g1:dim"):
        await make_index(redis, prefix)
    total = await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace=value, agent_id=value))
    assert total == 0  # nothing stored under these: never a syntax error, never everything


async def test_scope_filters_and_bm25(redis, prefix):
    keys = await make_index(redis, prefix)
    rows = [
        ("e1", "fix failing database migration", "success", 0.9, "a1"),
        ("e2", "write release notes", "failure", 0.1, "a1"),
        ("e3", "database index tuning", "partial", 0.5, "a2"),
    ]
    for i, (eid, text, outcome, reward, agent) in enumerate(rows):
        await put(
            redis,
            keys,
            "ns",
            Episode(
                episode_id=eid,
                agent_id=agent,
                task=Task(description=text),
                outcome=outcome,
                feedback=Feedback(reward=reward),
                completed_at=100.0 * (i + 1),
            ),
            unit(i),
        )
    alias = keys.episode_index_alias

    async def ids(scope):
        _, hits = await filter_search(redis, alias, scope, return_fields=("doc",), sort_by="completed_at")
        return [hit_id(h) for h in hits]

    assert await ids(Scope(tags=BLAKE2B, namespace="ns", reward=(0.5, None))) == ["e3", "e1"]
    assert await ids(Scope(tags=BLAKE2B, namespace="ns", outcome=("success", "partial"))) == ["e3", "e1"]
    assert await ids(Scope(tags=BLAKE2B, namespace="ns", since=100.0, until=200.0)) == ["e2", "e1"]
    assert await ids(Scope(tags=BLAKE2B, namespace="ns", agent_id="a1")) == ["e2", "e1"]
    assert await ids(Scope(tags=BLAKE2B, namespace="other")) == []
    hits = await bm25_search(
        redis, alias, Scope(tags=BLAKE2B, namespace="ns"), "database migration?", 10, return_fields=("doc",)
    )
    assert [hit_id(h) for h in hits][0] == "e1" and len(hits) == 2
    assert (
        await bm25_search(redis, alias, Scope(tags=BLAKE2B, namespace="ns"), "  ?? ", 10, return_fields=())
        == []
    )


async def test_other_embedder_conflicts(redis, prefix):
    keys = await make_index(redis, prefix)
    with pytest.raises(Conflict, match="engram-admin reindex"):
        await ensure_episode_index(
            redis, keys, 1, VectorParams(dim=DIM, algorithm="FLAT"), "other", tag_key=None
        )


def test_escape_tag_examples():
    assert escape_tag("a.b@c") == "a\\.b\\@c"
    assert escape_tag("日本語") == "日本語"
    assert escape_tag("_ x") == "\\_\\ x"


async def test_bm25_ranks_documents_matching_more_words_first_within_the_scope(redis, prefix):
    """`scope @fields:(w1|w2|w3)` must not score a one-word match above a three-word one."""
    keys = await make_index(redis, prefix)
    texts = {
        "pp": "write unit tests for the payment parser",
        "login": "fix the flaky login test",
        "svc": "rewrite the payment service",
        "gw": "deploy the api gateway",
        "uni": "parser errors on unicode input",
        "rel": "release notes",
    }
    solution = "split the tokenizer into a lexer and a recursive descent stage, added property tests " * 3
    for i, (eid, text) in enumerate(texts.items()):
        await put(
            redis,
            keys,
            "ns",
            Episode(
                episode_id=eid,
                task=Task(description=text),
                outcome="success",
                solution=solution if eid == "pp" else None,
                completed_at=1.0,
            ),
            unit(i),
        )
    await put(
        redis,
        keys,
        "other",
        Episode(
            episode_id="x",
            task=Task(description="payment parser tests " * 5),
            outcome="success",
            completed_at=1.0,
        ),
        unit(0),
    )
    hits = await bm25_search(
        redis,
        keys.episode_index_alias,
        Scope(tags=BLAKE2B, namespace="ns"),
        "payment parser tests",
        10,
        return_fields=("doc",),
    )
    ranked = [hit_id(h) for h in hits]
    assert ranked[0] == "pp" and set(ranked) == {"pp", "login", "svc", "uni"}
    assert hits[0].score > hits[1].score


async def test_scope_does_not_change_the_bm25_order(redis, prefix):
    """The scope must filter, not score: ranked with or without it, the scope's documents keep their
    BM25 order (the plain `scope @fields:(...)` form fails this on RediSearch 2.10)."""
    from shared.index import keyword_query

    index = f"{prefix}bt"
    await redis.execute_command(
        "FT.CREATE",
        index,
        "ON",
        "HASH",
        "PREFIX",
        1,
        f"{prefix}bt:",
        "SCHEMA",
        "namespace",
        "TAG",
        "status",
        "TAG",
        "task",
        "TEXT",
        "WEIGHT",
        2,
        *[x for name, _ in TEXT_FIELDS if name != "task" for x in (name, "TEXT")],
    )
    docs = {
        "1": "write unit tests for the payment parser",
        "2": "fix the flaky login test",
        "3": "rewrite the payment service",
        "4": "deploy the api gateway",
        "5": "parser errors on unicode input",
        "6": "release notes",
    }
    for k, text in docs.items():
        await redis.hset(f"{prefix}bt:{k}", mapping={"namespace": "a", "status": "completed", "task": text})

    async def order(q):
        reply = await redis.execute_command(
            "FT.SEARCH", index, q, "SCORER", "BM25STD", "WITHSCORES", "NOCONTENT", "DIALECT", 2
        )
        return [reply[i].decode().rsplit(":", 1)[1] for i in range(1, len(reply), 2)]

    text = "payment parser tests"
    unscoped = await order(keyword_query(text))
    assert unscoped[0] == "1"
    assert await order(keyword_query(text, Scope(tags=BLAKE2B, namespace="a").query())) == unscoped


async def test_returned_tenancy_tags_are_the_bytes_written(redis, prefix):
    """namespace, outcome and status are SORTABLE UNF (`SORTABLE_TAG_FIELDS`), and what a search
    returns of them is the bytes written, case included: "User-A"'s document must never read as
    "user-a"'s (a normalised sortable value would be lowercased)."""
    keys = await make_index(redis, prefix)
    info = await redis.execute_command("FT.INFO", keys.episode_index_alias)
    attrs = dict(zip(info[::2], info[1::2], strict=False))[b"attributes"]
    by_name = {a[a.index(b"attribute") + 1].decode(): a for a in attrs}
    for name in SORTABLE_TAG_FIELDS:
        assert b"SORTABLE" in by_name[name] and b"UNF" in by_name[name], by_name[name]
    for i, value in enumerate(C12_IDS):
        ep = Episode(episode_id="e", task=Task(description="t"), outcome=value, completed_at=1000.0 + i)
        await put(redis, keys, value, ep, unit(i))
    for value in C12_IDS:
        scope = Scope(tags=BLAKE2B, namespace=value, status=STATUS_COMPLETED)
        hits = await knn_search(
            redis, keys.episode_index_alias, scope, unit(0), 5, return_fields=("namespace", "outcome")
        )
        assert len(hits) == 1 and hits[0].fields[b"namespace"] == value.encode(), (value, hits[0].fields)
        assert hits[0].fields[b"outcome"] == value.encode()
    others = [Scope(tags=BLAKE2B, namespace=v, status=STATUS_COMPLETED) for v in ("user-a", "USER-A")]
    (hit,) = await knn_search(
        redis,
        keys.episode_index_alias,
        Scope(tags=BLAKE2B, namespace="User-A"),
        unit(0),
        1,
        return_fields=("namespace",),
    )
    assert hit.fields[b"namespace"] == b"User-A"
    assert [hit.fields[b"namespace"] == s.namespace.encode() for s in others] == [False, False]


async def test_index_exists_and_index_size_answer_as_ft_info_does(redis, prefix):
    """`index_exists` (FT.EXPLAIN) and `index_size` (a wildcard count) replace FT.INFO, which costs
    Redis ~19 ms of its main thread at 100k documents: same answers, for an index and its alias."""
    keys = await make_index(redis, prefix)
    for name in (keys.episode_index(1), keys.episode_index_alias):
        assert await index_exists(redis, name)
    assert not await index_exists(redis, f"{prefix}:no-such-index")
    for i in range(7):
        ep = Episode(
            episode_id=f"e{i}", task=Task(description="t"), outcome="success", completed_at=1000.0 + i
        )
        await put(redis, keys, "a" if i % 2 else "b", ep, unit(i))
    await redis.hset(f"{prefix}:not-an-episode", mapping={"x": "1"})  # outside the index's prefix
    info = await redis.execute_command("FT.INFO", keys.episode_index_alias)
    num_docs = int(dict(zip(info[::2], info[1::2], strict=False))[b"num_docs"])
    assert await index_size(redis, keys.episode_index_alias) == num_docs == 7
    await redis.delete(keys.episode_doc(1, "a", "e1"))
    assert await index_size(redis, keys.episode_index(1)) == 6
