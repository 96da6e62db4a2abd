"""Sorted lists without a count (`shared.index.filter_search(counted=False)`): RediSearch's sort
optimizer (`WITHOUTCOUNT`) on the real module gives the same values as the counted sort for every
scope, field, order and depth tried, and a reply it cut short (RediSearch 2.10.5 does under a filter
that keeps few documents) is asked again counted. Real Redis with the module."""

from __future__ import annotations

import dataclasses
import random

import numpy as np

from engram_episodic.validation import parse_episode
from shared.index import STATUS_COMPLETED, Scope, SearchHit, episode_fields, filter_search
from shared.keys import Keys
from shared.tags import BLAKE2B
from tests.helpers import wait_until
from tests.integration.test_query_support import episode, fully_indexed

pytest_plugins = ["tests.integration.test_query_support"]

N = 2_000
FIELDS = ("completed_at", "reward", "importance")


def _values(hits: list[SearchHit], field: str) -> list[float]:
    return [float(h.fields[field.encode()]) for h in hits]


async def _seed(redis, prefix: str) -> None:
    """N episodes over two namespaces and 40 users, half of them one user's (the filters then keep
    from ~0.6% to ~50% of the index); completed_at distinct, reward and importance coarse (ties)."""
    rng = random.Random(20)
    keys = Keys(prefix)
    vector = np.zeros(256, dtype=np.float32)
    vector[-1] = 1.0
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(N):
            user = "many" if rng.random() < 0.5 else f"u{rng.randrange(40)}"
            data = episode(
                f"s{i}",
                task=f"task {i}",
                completed_at=1_700_000_000.0 + rng.random() * 1e6,
                reward=rng.choice([0.0, 0.25, 0.5, 1.0]) if i % 3 else None,
                importance=rng.randrange(1, 11),
                user_id=user,
                outcome=rng.choice(["success", "failure"]),
            )
            ns = "big" if i % 5 else "small"
            ep = parse_episode(data)
            pipe.hset(
                keys.episode_doc(1, ns, ep.episode_id),
                mapping=episode_fields(ns, ep, status=STATUS_COMPLETED, vector=vector, tags=BLAKE2B),
            )
        await pipe.execute()


async def test_the_sort_optimizer_answers_as_the_counted_sort(make_client, redis, prefix):
    await make_client()
    await _seed(redis, prefix)
    await wait_until(lambda: fully_indexed(redis, prefix), timeout=30)
    index = Keys(prefix).episode_index_alias
    fast_replies: list[tuple[int, int]] = []  # (hits, limit) of each WITHOUTCOUNT reply
    real = redis.execute_command

    async def spy(*args, **kwargs):
        reply = await real(*args, **kwargs)
        if "WITHOUTCOUNT" in args:
            limit = int(args[args.index("LIMIT") + 2])
            fast_replies.append(((len(reply) - 1) // 2, limit))
        return reply

    redis.execute_command = spy
    try:
        scopes = [Scope(tags=BLAKE2B, namespace="big"), Scope(tags=BLAKE2B, namespace="small")]
        scopes += [Scope(tags=BLAKE2B, namespace="big", user_id=u) for u in ("many", "u3", "u17", "u39")]
        scopes += [Scope(tags=BLAKE2B, namespace="big", outcome=("failure",), user_id="u8")]
        scopes += [Scope(tags=BLAKE2B, namespace="small", reward=(0.5, None))]
        compared = 0
        for scope in scopes:
            for field in FIELDS:
                if field != "completed_at":  # as the lists ask: only episodes that have the value
                    lo, hi = getattr(scope, field)
                    scope = dataclasses.replace(scope, **{field: (lo if lo is not None else -1e300, hi)})
                for limit in (1, 5, 21, 101):
                    for descending in (True, False):
                        kw = dict(
                            return_fields=(field, "tiebreak"),
                            sort_by=field,
                            descending=descending,
                            limit=limit,
                        )
                        _, counted = await filter_search(redis, index, scope, **kw)
                        _, fast = await filter_search(redis, index, scope, counted=False, **kw)
                        assert _values(fast, field) == _values(counted, field), (scope, field, limit)
                        compared += 1
    finally:
        redis.execute_command = real
    assert compared == len(scopes) * len(FIELDS) * 4 * 2
    assert len(fast_replies) == compared  # every one went through the optimizer first


async def test_a_reply_the_optimizer_cut_short_is_asked_again_counted(make_client, redis, prefix):
    """RediSearch 2.10.5 returned 44 of 101 existing matches under a narrow filter: a short reply is
    never the answer (the module's cut is stood in for by dropping the reply's last hits)."""
    await make_client()
    await _seed(redis, prefix)
    await wait_until(lambda: fully_indexed(redis, prefix), timeout=30)
    index = Keys(prefix).episode_index_alias
    scope = Scope(tags=BLAKE2B, namespace="big")
    kw = dict(return_fields=("completed_at",), sort_by="completed_at", limit=21)
    _, counted = await filter_search(redis, index, scope, **kw)
    real, sent = redis.execute_command, []

    async def cut(*args, **kwargs):
        reply = await real(*args, **kwargs)
        sent.append("WITHOUTCOUNT" in args)
        return reply[:-10] if "WITHOUTCOUNT" in args else reply  # 5 hits fewer

    redis.execute_command = cut
    try:
        _, fast = await filter_search(redis, index, scope, counted=False, **kw)
    finally:
        redis.execute_command = real
    assert sent == [True, False]
    assert [h.key for h in fast] == [h.key for h in counted] and len(fast) == 21
